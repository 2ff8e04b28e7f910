# Fuzzing (libFuzzer, clang): tests/fuzz/fuzz_*.c.
#
#   make [-jN] fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="fuzz_decode ..."]
#       build every target with clang -fsanitize=fuzzer,address,undefined into
#       build/fuzz and run each (N at a time) for FUZZ_SECONDS on its corpus
#       build/fuzz/corpus/TARGET (grown across runs), seeded from the captures
#       (tests/fuzz/mkseeds.sh) and tests/fuzz/regressions/TARGET.  A crash
#       leaves its input in build/fuzz/crashes/TARGET/ and fails the run.
#   make fuzz-build     the binaries only
#   make fuzz-regress   every target linked with tests/fuzz/standalone.c
#       (no libFuzzer) under ASan+UBSan in build/asan, replaying the seeds and
#       tests/fuzz/regressions/: what once crashed must not crash again
#
# Generated corpora stay under build/; only hand-picked inputs that found a
# bug go to tests/fuzz/regressions/TARGET/ (keep them small).

FUZZ_B        := build/fuzz
FUZZ_CC       ?= clang
FUZZ_SECONDS  ?= 60
FUZZ_RSS_MB   ?= 2048
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_OPT      := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN)
FUZZ_NAMES    := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS  ?= $(FUZZ_NAMES)
# libFuzzer options for every run (max_len: payloads in the captures are < 6 KB)
FUZZ_FLAGS    ?= -max_len=65536 -timeout=30 -rss_limit_mb=$(FUZZ_RSS_MB) -print_final_stats=1

.PHONY: fuzz fuzz-build fuzz-seeds fuzz-regress fuzz-bins fuzz-standalone-bins

fuzz-build:
	@$(MAKE) --no-print-directory B=$(FUZZ_B) CC=$(FUZZ_CC) OPT="$(FUZZ_OPT)" fuzz-bins

fuzz-seeds:
	@rm -rf $(FUZZ_B)/seeds && bash tests/fuzz/mkseeds.sh $(FUZZ_B)/seeds

fuzz: fuzz-build fuzz-seeds
	@rm -f $(FUZZ_TARGETS:%=$(FUZZ_B)/%.failed)
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=fuzz-run-%)
	@failed=""; for t in $(FUZZ_TARGETS); do [ -e $(FUZZ_B)/$$t.failed ] && failed="$$failed $$t"; done; \
	[ -z "$$failed" ] || { echo "fuzz: failed:$$failed (inputs in $(FUZZ_B)/crashes/, logs $(FUZZ_B)/TARGET.log)"; exit 1; }

# One target's run (make -jN fuzz runs N at a time); a failure is recorded
# in $(FUZZ_B)/TARGET.failed so that every target runs.
fuzz-run-%:
	@t=$*; mkdir -p $(FUZZ_B)/corpus/$$t $(FUZZ_B)/crashes/$$t tests/fuzz/regressions/$$t; \
	dict=$$(case $$t in fuzz_decode|fuzz_frames) echo tests/fuzz/msgpack.dict;; \
	                    fuzz_config) echo tests/fuzz/config.dict;; \
	                    fuzz_promtext) echo tests/fuzz/promtext.dict;; esac); \
	echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
	if $(FUZZ_B)/$$t $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECONDS) \
	     $${dict:+-dict=$$dict} -artifact_prefix=$(FUZZ_B)/crashes/$$t/ \
	     $(FUZZ_B)/corpus/$$t $(FUZZ_B)/seeds/$$t tests/fuzz/regressions/$$t \
	     2>$(FUZZ_B)/$$t.log; then \
	  echo "== fuzz $$t: $$(sed -n 's/^stat::number_of_executed_units: *//p' $(FUZZ_B)/$$t.log) runs, no crash"; \
	else \
	  { echo "== fuzz $$t FAILED:"; \
	    grep -E 'ERROR|runtime error|SUMMARY|invariant|^    #[0-9] |Test unit written' \
	      $(FUZZ_B)/$$t.log | head -n 20; } ; \
	  touch $(FUZZ_B)/$$t.failed; \
	fi

fuzz-regress:
	@$(MAKE) --no-print-directory B=build/asan CC=clang \
	  OPT="-O1 -g -fno-omit-frame-pointer $(FUZZ_SAN)" LDFLAGS="$(FUZZ_SAN)" \
	  fuzz-standalone-bins
	@bash tests/fuzz/mkseeds.sh build/asan/fuzz-seeds
	@failed=""; for t in $(FUZZ_NAMES); do \
	  mkdir -p tests/fuzz/regressions/$$t; \
	  echo "== replay $$t: seeds and tests/fuzz/regressions/$$t"; \
	  if build/asan/$$t-replay build/asan/fuzz-seeds/$$t tests/fuzz/regressions/$$t \
	       2>build/asan/$$t-replay.log; then tail -n 1 build/asan/$$t-replay.log; \
	  else grep -E '^running' build/asan/$$t-replay.log | tail -n 1; \
	    grep -E 'ERROR|runtime error|SUMMARY|invariant|^    #[0-9] ' build/asan/$$t-replay.log | head -n 12; \
	    failed="$$failed $$t"; fi; \
	done; \
	[ -z "$$failed" ] || { echo "fuzz-regress: failed:$$failed (logs: build/asan/TARGET-replay.log)"; exit 1; }

# Used by the two targets above, inside a sub-make with B and OPT set.
fuzz-bins: $(FUZZ_NAMES:%=$(B)/%)
fuzz-standalone-bins: $(FUZZ_NAMES:%=$(B)/%-replay)

$(B)/fuzz_%: $(B)/obj/tests/fuzz/fuzz_%.o $(B)/libkvb.a
	$(CC) $(LDFLAGS) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ $(LDLIBS)

$(B)/fuzz_%-replay: $(B)/obj/tests/fuzz/fuzz_%.o $(B)/obj/tests/fuzz/standalone.o $(B)/libkvb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
