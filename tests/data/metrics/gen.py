#!/usr/bin/python3
"""Regenerate the engines' /metrics samples in this folder (run from anywhere):

    /usr/bin/python3 tests/data/metrics/gen.py      # Debian: python3-prometheus-client

The text is rendered by prometheus_client itself (the library both engines
use), from metric definitions copied from the engines' sources: names, label
names, bucket lists, the info-gauge trick of vllm:cache_config_info and the
multiprocess collector of SGLang.  Only the values are made up (fixed, so the
output is reproducible; the clock is pinned for the _created series).

  vllm.txt      vLLM V1 (0.10.x), one API server in front of 2 data-parallel
                engines (label engine="0"/"1"): vllm/v1/metrics/loggers.py
                (PrometheusStatLogger, make_per_engine, log_metrics_info) and
                vllm/config/cache.py (CacheConfig.metrics_info); plus what the
                API server adds (python/process collectors, http_* from
                prometheus-fastapi-instrumentator).
  vllm-v0.8.txt vLLM V1 0.8.x, one engine: the older names only
                (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*), and
                cache_config_info without an engine label.
  sglang.txt    SGLang with --dp-size 2 --enable-dp-attention --tp 4:
                python/sglang/srt/metrics/collector.py (SchedulerMetricsCollector,
                TokenizerMetricsCollector) with the labels of
                python/sglang/srt/managers/scheduler_metrics_mixin.py
                (model_name, engine_type, tp_rank, pp_rank, [dp_rank]) and
                moe_ep_rank; rendered through MultiProcessCollector as SGLang
                does (PROMETHEUS_MULTIPROC_DIR).
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1760000000.0


def pin_clock():
    time.time = lambda: T0


def buckets_125(max_value):
    out, e = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**e
            if v > max_value:
                return out
            out.append(v)
        e += 1


TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0]
LAT = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
       120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def api_server_extras(reg):
    """What a vLLM API server process shows besides the engine metrics."""
    from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                        HistogramMetricFamily)

    class Extras:
        def collect(self):
            g = CounterMetricFamily("python_gc_objects_collected",
                                    "Objects collected during gc", labels=["generation"])
            for gen, v in (("0", 12045.0), ("1", 3391.0), ("2", 1102.0)):
                g.add_metric([gen], v)
            yield g
            i = GaugeMetricFamily("python_info", "Python platform information",
                                  labels=["implementation", "major", "minor", "patchlevel",
                                          "version"])
            i.add_metric(["CPython", "3", "12", "11", "3.12.11"], 1.0)
            yield i
            yield GaugeMetricFamily("process_virtual_memory_bytes",
                                    "Virtual memory size in bytes.", value=4.3117858816e+10)
            yield GaugeMetricFamily("process_resident_memory_bytes",
                                    "Resident memory size in bytes.", value=1.837203456e+09)
            yield GaugeMetricFamily("process_start_time_seconds",
                                    "Start time of the process since unix epoch in seconds.",
                                    value=1759999812.4)
            yield CounterMetricFamily("process_cpu_seconds", "Total user and system CPU time "
                                      "spent in seconds.", value=391.27)
            yield GaugeMetricFamily("process_open_fds", "Number of open file descriptors.",
                                    value=112.0)
            r = CounterMetricFamily("http_requests", "Total number of requests by method, "
                                    "status and handler.", labels=["method", "status", "handler"])
            r.add_metric(["GET", "2xx", "/metrics"], 1733.0)
            r.add_metric(["POST", "2xx", "/v1/chat/completions"], 512.0)
            r.add_metric(["GET", "2xx", "/health"], 860.0)
            r.add_metric(["POST", "4xx", "/v1/completions"], 3.0)
            yield r
            h = HistogramMetricFamily("http_request_duration_seconds", "Latency with only few "
                                      "buckets by handler. Made to be only used if aggregation "
                                      "by handler is important.", labels=["handler", "method"])
            h.add_metric(["/v1/chat/completions", "POST"],
                         [("0.1", 0.0), ("0.5", 3.0), ("1.0", 41.0), ("+Inf", 512.0)], 2211.5)
            yield h

    reg.register(Extras())


def vllm_current(path):
    import prometheus_client as pc
    reg = pc.CollectorRegistry(auto_describe=True)
    api_server_extras(reg)
    model, engines, max_model_len = "Qwen/Qwen3-8B", [0, 1], 40960
    labelnames = ["model_name", "engine"]

    def per_engine(cls, name, doc, **kw):
        m = cls(name=name, documentation=doc, labelnames=labelnames, registry=reg, **kw)
        return {e: m.labels(model, str(e)) for e in engines}

    G, C, H = pc.Gauge, pc.Counter, pc.Histogram
    running = per_engine(G, "vllm:num_requests_running",
                         "Number of requests in model execution batches.")
    waiting = per_engine(G, "vllm:num_requests_waiting",
                         "Number of requests waiting to be processed.")
    gpu_usage = per_engine(G, "vllm:gpu_cache_usage_perc",
                           "GPU KV-cache usage. 1 means 100 percent usage."
                           "DEPRECATED: Use vllm:kv_cache_usage_perc instead.")
    gpu_q = per_engine(C, "vllm:gpu_prefix_cache_queries",
                       "GPU prefix cache queries, in terms of number of queried"
                       "tokens. DEPRECATED: Use vllm:prefix_cache_queries instead.")
    gpu_h = per_engine(C, "vllm:gpu_prefix_cache_hits",
                       "GPU prefix cache hits, in terms of number of cached "
                       "tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.")
    usage = per_engine(G, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    q = per_engine(C, "vllm:prefix_cache_queries",
                   "Prefix cache queries, in terms of number of queried tokens.")
    h = per_engine(C, "vllm:prefix_cache_hits",
                   "Prefix cache hits, in terms of number of cached tokens.")
    pre = per_engine(C, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
    pt = per_engine(C, "vllm:prompt_tokens", "Number of prefill tokens processed.")
    gt = per_engine(C, "vllm:generation_tokens", "Number of generation tokens processed.")
    succ = C(name="vllm:request_success", documentation="Count of successfully processed requests.",
             labelnames=labelnames + ["finished_reason"], registry=reg)
    hists = {}
    for name, doc, b in (
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
             buckets_125(max_model_len)),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.",
             buckets_125(max_model_len)),
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
             [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]),
            ("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20]),
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             TTFT),
            ("vllm:time_per_output_token_seconds",
             "Histogram of time per output token in seconds.", TPOT),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             LAT),
            ("vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", LAT)):
        hists[name] = per_engine(H, name, doc, buckets=b)

    # vllm:cache_config_info: CacheConfig.metrics_info() = {k: str(v) for k, v in
    # self.__dict__.items()} plus "engine", one series per engine, value 1.
    cache = dict(block_size=16, gpu_memory_utilization=0.9, swap_space=4, cache_dtype="auto",
                 is_attention_free=False, num_gpu_blocks_override=None, sliding_window=None,
                 enable_prefix_caching=True, prefix_caching_hash_algo="sha256",
                 cpu_offload_gb=0, calculate_kv_scales=False, cpu_kvcache_space_bytes=None,
                 mamba_page_size_padded=None, mamba_cache_dtype="auto",
                 mamba_ssm_cache_dtype="auto", kv_sharing_fast_prefill=False,
                 kv_cache_memory_bytes=None, num_gpu_blocks=27473, num_cpu_blocks=None,
                 swap_space_bytes=4294967296)
    info = {k: str(v) for k, v in cache.items()}
    info["engine"] = ""
    ig = G(name="vllm:cache_config_info", documentation="Information of the LLMEngine CacheConfig",
           labelnames=info.keys(), registry=reg)
    for e in engines:
        info["engine"] = str(e)
        ig.labels(**info).set(1)

    vals = {0: (7, 2, 0.6234, 981344, 603219, 3, 2313411, 401233),
            1: (5, 0, 0.4117, 902210, 441870, 0, 2104877, 377104)}
    for e, (r, w, u, qq, hh, pp, p, g) in vals.items():
        running[e].set(r)
        waiting[e].set(w)
        gpu_usage[e].set(u)
        usage[e].set(u)
        gpu_q[e].inc(qq)
        gpu_h[e].inc(hh)
        q[e].inc(qq)
        h[e].inc(hh)
        pre[e].inc(pp)
        pt[e].inc(p)
        gt[e].inc(g)
        for reason, n in (("stop", 410 - 30 * e), ("length", 22), ("abort", 1)):
            succ.labels(model, str(e), reason).inc(n)
        for x in (12, 150, 1033, 7000, 18000):
            hists["vllm:request_prompt_tokens"][e].observe(x)
        for x in (1, 20, 200, 900):
            hists["vllm:request_generation_tokens"][e].observe(x)
        for x in (1, 9, 300, 4100, 9000):
            hists["vllm:iteration_tokens_total"][e].observe(x)
        hists["vllm:request_params_n"][e].observe(1)
        for x in (0.02, 0.07, 0.31, 1.9):
            hists["vllm:time_to_first_token_seconds"][e].observe(x)
        for x in (0.011, 0.018, 0.034):
            hists["vllm:time_per_output_token_seconds"][e].observe(x)
        for x in (0.9, 4.2, 33.0):
            hists["vllm:e2e_request_latency_seconds"][e].observe(x)
            hists["vllm:request_queue_time_seconds"][e].observe(x / 50)
    write(path, pc.generate_latest(reg))


def vllm_08(path):
    import prometheus_client as pc
    reg = pc.CollectorRegistry(auto_describe=True)
    api_server_extras(reg)
    labelnames, labelvalues = ["model_name", "engine"], ["meta-llama/Llama-3.1-8B-Instruct", "0"]
    G, C = pc.Gauge, pc.Counter
    G("vllm:num_requests_running", "Number of requests in model execution batches.",
      labelnames, registry=reg).labels(*labelvalues).set(3)
    G("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
      labelnames, registry=reg).labels(*labelvalues).set(1)
    G("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
      labelnames, registry=reg).labels(*labelvalues).set(0.125)
    C("vllm:gpu_prefix_cache_queries",
      "GPU prefix cache queries, in terms of number of queried blocks.",
      labelnames, registry=reg).labels(*labelvalues).inc(4096)
    C("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached blocks.",
      labelnames, registry=reg).labels(*labelvalues).inc(1024)
    C("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
      labelnames, registry=reg).labels(*labelvalues)
    C("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
      labelnames, registry=reg).labels(*labelvalues).inc(88123)
    info = {k: str(v) for k, v in dict(
        block_size=16, gpu_memory_utilization=0.9, swap_space=4, cache_dtype="auto",
        is_attention_free=False, num_gpu_blocks_override=None, sliding_window=None,
        enable_prefix_caching=True, prefix_caching_hash_algo="builtin", cpu_offload_gb=0,
        calculate_kv_scales=False, num_gpu_blocks=8192, num_cpu_blocks=2048,
        swap_space_bytes=4294967296).items()}
    G("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
      labelnames=info.keys(), registry=reg).labels(**info).set(1)
    write(path, pc.generate_latest(reg))


# Run in a child: PROMETHEUS_MULTIPROC_DIR must be set before the import.
SGLANG_CHILD = r'''
import os, sys, time
time.time = lambda: %r
import prometheus_client as pc
from prometheus_client import multiprocess
G, C, H = pc.Gauge, pc.Counter, pc.Histogram
model = "Qwen/Qwen3-30B-A3B"
ranks = [dict(model_name=model, engine_type="unified", tp_rank=str(tp), pp_rank="0",
              moe_ep_rank=str(tp), dp_rank=str(dp)) for dp, tp in ((0, 0), (1, 2))]
names = list(ranks[0].keys())
def g(name, doc):
    # SGLang says multiprocess_mode="mostrecent" (prometheus_client >= 0.17); each
    # series has one writer, so "max" (in Debian's 0.16) renders the same text.
    return G(name=name, documentation=doc, labelnames=names, multiprocess_mode="max")
m = dict(
    num_running_reqs=g("sglang:num_running_reqs", "The number of running requests."),
    num_used_tokens=g("sglang:num_used_tokens", "The number of used tokens."),
    token_usage=g("sglang:token_usage", "The token usage."),
    gen_throughput=g("sglang:gen_throughput", "The generation throughput (token/s)."),
    num_queue_reqs=g("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    num_grammar_queue_reqs=g("sglang:num_grammar_queue_reqs",
                             "The number of requests in the grammar waiting queue."),
    cache_hit_rate=g("sglang:cache_hit_rate", "The prefix cache hit rate."),
    max_total_num_tokens=g("sglang:max_total_num_tokens",
                           "Maximum total number of tokens in the KV cache pool."),
    spec_accept_length=g("sglang:spec_accept_length",
                         "The average acceptance length of speculative decoding."),
    utilization=g("sglang:utilization", "The utilization."),
    engine_startup_time=g("sglang:engine_startup_time",
                          "The time taken for the engine to start up."),
)
retracted = C(name="sglang:num_retracted_requests_total",
              documentation="Total number of retracted requests.", labelnames=names)
queue_time = H(name="sglang:queue_time_seconds", documentation="Histogram of queueing time in seconds.",
               labelnames=names, buckets=[0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60])
vals = [dict(num_running_reqs=14, num_used_tokens=101352, token_usage=0.56, gen_throughput=1893.42,
             num_queue_reqs=3, num_grammar_queue_reqs=0, cache_hit_rate=0.4375,
             max_total_num_tokens=180984, spec_accept_length=0.0, utilization=0.0,
             engine_startup_time=41.73),
        dict(num_running_reqs=9, num_used_tokens=57915, token_usage=0.32, gen_throughput=1204.9,
             num_queue_reqs=0, num_grammar_queue_reqs=0, cache_hit_rate=0.125,
             max_total_num_tokens=180984, spec_accept_length=0.0, utilization=0.0,
             engine_startup_time=41.02)]
for lab, v in zip(ranks, vals):
    for k, x in v.items():
        m[k].labels(**lab).set(x)
    retracted.labels(**lab).inc(2)
    for x in (0.0, 0.05, 0.3, 2.5):
        queue_time.labels(**lab).observe(x)
# TokenizerMetricsCollector (in the tokenizer manager process)
tl = ["model_name", "engine_type"]
tv = [model, "unified"]
C(name="sglang:prompt_tokens_total", documentation="Number of prefill tokens processed.",
  labelnames=tl).labels(*tv).inc(5133207)
C(name="sglang:generation_tokens_total", documentation="Number of generation tokens processed.",
  labelnames=tl).labels(*tv).inc(990311)
C(name="sglang:cached_tokens_total", documentation="Number of cached prompt tokens.",
  labelnames=tl).labels(*tv).inc(2049911)
C(name="sglang:num_requests_total", documentation="Number of requests processed.",
  labelnames=tl).labels(*tv).inc(4410)
ttft = H(name="sglang:time_to_first_token_seconds",
         documentation="Histogram of time to first token in seconds.", labelnames=tl,
         buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400])
for x in (0.15, 0.31, 0.9, 7.2):
    ttft.labels(*tv).observe(x)
reg = pc.CollectorRegistry()
multiprocess.MultiProcessCollector(reg)
sys.stdout.buffer.write(pc.generate_latest(reg))
'''


def sglang(path):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=d)
        out = subprocess.run([sys.executable, "-c", SGLANG_CHILD % T0], env=env, check=True,
                             stdout=subprocess.PIPE).stdout
    write(path, out)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    print("%s: %d bytes, %d lines" % (path, len(data), data.count(b"\n")))


if __name__ == "__main__":
    pin_clock()
    vllm_current(os.path.join(HERE, "vllm.txt"))
    vllm_08(os.path.join(HERE, "vllm-v0.8.txt"))
    sglang(os.path.join(HERE, "sglang.txt"))
