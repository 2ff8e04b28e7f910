# Benchmarks (tests/bench): not part of `make check`.
#
#   make bench            end-to-end: engine -> kvbridge -> nats-server -> subscriber,
#                         against a raw ZMQ->NATS forwarder; one table, also
#                         written to $(B)/bench/results.txt  (~3 minutes)
#   make bench-callgrind  instructions per engine event of the pure pipeline
#                         (decode -> convert -> encode), per mix, plus the top
#                         functions (callgrind_annotate)
#   make bench-rss        kvbridge fed 10M events (decode mix): VmRSS every second
#   make bench-scrape     CPU of scraping an engine's /metrics (the vLLM page)
#                         every 500 ms for 20 s: build/bench/scrape-cost
#   make bench-query      publish delay of a live stream while 1M-block dumps
#                         are served (/v1/dump), against the same stream quiet
#
# Tools go to $(B)/bench/; they link $(B)/libkvb.a like the unit tests.

BENCH_OUT   := $(B)/bench
BENCH_TOOLS := $(BENCH_OUT)/bench-pub $(BENCH_OUT)/count-sub $(BENCH_OUT)/forwarder \
               $(BENCH_OUT)/capture $(BENCH_OUT)/pipeline-bench $(BENCH_OUT)/scrape-cost
BENCH_DEPS  := $(B)/kvbridge $(B)/kvsim $(BENCH_TOOLS)

.PHONY: bench bench-tools bench-callgrind bench-rss bench-scrape bench-query

bench-tools: $(BENCH_TOOLS)

$(B)/obj/tests/bench/%.o: tests/bench/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(PRIV_CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BENCH_OUT)/bench-pub: $(B)/obj/tests/bench/pub.o $(B)/obj/tests/bench/benchgen.o $(B)/libkvb.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lm

$(BENCH_OUT)/pipeline-bench: $(B)/obj/tests/bench/pipeline_bench.o $(B)/obj/tests/bench/benchgen.o $(B)/libkvb.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BENCH_OUT)/count-sub: $(B)/obj/tests/bench/count_sub.o $(B)/obj/tests/bench/benchgen.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BENCH_OUT)/forwarder: $(B)/obj/tests/bench/forwarder.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BENCH_OUT)/capture: $(B)/obj/tests/bench/capture.o $(B)/obj/tests/bench/benchgen.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

bench: $(BENCH_DEPS)
	@B=$(B) bash tests/bench/run.sh

bench-callgrind: $(B)/kvsim $(BENCH_OUT)/capture $(BENCH_OUT)/pipeline-bench
	@B=$(B) bash tests/bench/callgrind.sh

bench-rss: $(BENCH_DEPS)
	@B=$(B) bash tests/bench/rss.sh

# instructions of the pipeline with metrics collection on and compiled out
.PHONY: bench-metrics-cost
bench-metrics-cost:
	@B=$(B) bash tests/bench/metrics_cost.sh

$(BENCH_OUT)/scrape-cost: $(B)/obj/tests/bench/scrape_cost.o $(B)/libkvb.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# CPU of the scraper: one vLLM page every 500 ms for 20 s
bench-scrape: $(BENCH_OUT)/scrape-cost
	$(BENCH_OUT)/scrape-cost tests/data/metrics/vllm.txt 20 500 1

bench-query: $(B)/kvbridge $(B)/kvsim
	B=$(B) bash tests/bench/query_dump.sh
