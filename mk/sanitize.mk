# Sanitizers and valgrind beyond `make check-valgrind` (unit tests, Makefile).
#
#   make check-asan     everything built with clang ASan+UBSan
#                       (-fno-sanitize-recover=all: any report fails) in
#                       build/asan; the unit tests, every integration test
#                       against those binaries (KVB_BIN) and the fuzz
#                       regressions (make fuzz-regress); everything runs, the
#                       failures are listed at the end; the sanitizer reports
#                       of the integration tests are kept in
#                       build/asan/reports/ (a report fails its test)
#   make check-asan-unit the unit tests and fuzz regressions under ASan+UBSan,
#                       and ASAN_SMOKE (three integration tests): what CI runs
#   make check-valgrind-integration
#                       kvbridge (the normal build) under valgrind memcheck in
#                       the integration tests (VG_ITEST: all but VG_EXCLUDE):
#                       a wrapper in build/valgrind-bin starts it as
#                       `valgrind --error-exitcode=99 --leak-check=full`, so a
#                       memory error or a leak at exit makes the test's
#                       "kvbridge exit code 0" check fail, and any non-empty
#                       valgrind report fails the target as well (a run whose
#                       exit code a test does not check); the reports are kept
#                       in build/valgrind-bin/TEST/vg.PID.log.  Suppressions:
#                       mk/valgrind.supp (third-party internals only)

ASAN_B      := build/asan
ASAN_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_OPT    := -O1 -g -fno-omit-frame-pointer $(ASAN_SAN)
ASAN_MAKE   := $(MAKE) --no-print-directory B=$(ASAN_B) CC=clang OPT="$(ASAN_OPT)" \
               LDFLAGS="$(ASAN_SAN)"
# Leaks are errors; a report stops the process with a non-zero exit.  Check's
# per-test timeouts get room for the slower code.
ASAN_AOPT   := detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1
ASAN_UOPT   := print_stacktrace=1:halt_on_error=1
ASAN_ENV    := ASAN_OPTIONS=$(ASAN_AOPT) UBSAN_OPTIONS=$(ASAN_UOPT) CK_TIMEOUT_MULTIPLIER=4
# The integration tests: every report (of kvbridge, kvsim, kvtail, and of a
# process whose exit code a test does not look at, or stopped by the cleanup
# of lib.sh) goes to a file in $(ASAN_RPT) (log_path: asan.PID, ubsan.PID)
# instead of a log in the test's temporary directory: a test that leaves a
# report fails even when all its checks passed, and the report is kept.
ASAN_RPT    := $(ASAN_B)/reports
ASAN_ENV_IT := ASAN_OPTIONS=$(ASAN_AOPT):log_path=$(CURDIR)/$(ASAN_RPT)/asan \
               UBSAN_OPTIONS=$(ASAN_UOPT):log_path=$(CURDIR)/$(ASAN_RPT)/ubsan

# A few integration tests under ASan for CI (check-asan-unit): the daemon's
# gap/replay path, SIGHUP reload (with kept sources), NATS through its I/O
# thread, HTTP metrics
ASAN_SMOKE  ?= tests/integration/test_daemon_gaps.sh tests/integration/test_daemon_reload.sh \
               tests/integration/test_daemon_reload_sources.sh tests/integration/test_ops_metrics.sh

VG_B        := build/valgrind-bin
# Integration tests not run under memcheck (kvbridge is 20-50x slower there):
#   test_inspect.sh, test_ops_install.sh  never start kvbridge (kvbridge-inspect
#       and make install only)
#   test_rel_backpressure.sh  the scenario is 2000 batches/s into a SUB queue
#       of 50 batches with a 200 kB NATS buffer: under memcheck kvbridge reads
#       far slower than that, the queue overflows outside the outage too, and
#       the exact barrier counts it checks no longer describe the outage (the
#       same pause/resume/replay paths run under memcheck in
#       test_rel_cluster.sh and test_daemon_replay.sh)
#   test_rel_jetstream.sh  case b SIGKILLs kvbridge 2.7 s into 10000 batches
#       at 2000 batches/s and expects the restart to resume from the state it
#       saved and the stream to get every event; case c stops kvbridge right
#       after the engine's last batch: both need kvbridge to keep up with the
#       engine, and under memcheck it does not (JetStream mode is covered
#       under memcheck by test_rel_cluster.sh, its acks, resends and
#       reconnects included)
#   test_rel_kill.sh  the same shape as case b (SIGKILL 2.7 s into 10000
#       batches at 2000 batches/s): under memcheck the restarted kvbridge is
#       up only after the engine's last batch, sees no new batch, so it never
#       learns of the gap and nothing is replayed (the state file's save runs
#       under memcheck in test_ops_systemd.sh, its load in the unit tests:
#       check_state under make check-valgrind)
#   test_hard_curve.sh  for now (new, not tuned for memcheck yet): with
#       CURVE at 1600 batches/s kvbridge under memcheck receives 581 of the
#       600 batches and kvtail (--timeout 2500, connect case: started before
#       kvbridge) fails its counts; its 3 kvbridge runs are clean under
#       memcheck.  Take it out of this list once it passes there.
VG_EXCLUDE  ?= tests/integration/test_inspect.sh tests/integration/test_ops_install.sh \
               tests/integration/test_rel_backpressure.sh tests/integration/test_rel_jetstream.sh \
               tests/integration/test_rel_kill.sh tests/integration/test_hard_curve.sh
VG_ITEST    ?= $(filter-out $(VG_EXCLUDE),$(ITEST))
VG_SUPP     := mk/valgrind.supp
VG_FLAGS    := -q --error-exitcode=99 --leak-check=full \
               --errors-for-leak-kinds=definite,indirect,possible \
               --suppressions=$(CURDIR)/$(VG_SUPP)

.PHONY: check-asan check-valgrind-integration deps-clang

# clang and its compiler-rt (ASan, UBSan, libFuzzer): apt-get, only when
# missing (like `make deps`; libclang-rt-dev is Debian's name for the
# default clang's runtime)
CLANG_PKGS := clang libclang-rt-dev
deps-clang:
	$(call apt_install,$(CLANG_PKGS))

check-asan:
	@echo "== check-asan: build ($(ASAN_B), clang $(ASAN_SAN))"
	@$(ASAN_MAKE) all
	@rm -f $(ASAN_B)/check-asan.failed
	@echo "== check-asan: unit tests"
	@for t in $(UNIT_SRC:tests/unit/%.c=$(ASAN_B)/tests/%); do echo "== $$t"; \
	  $(ASAN_ENV) $$t || echo "$$t" >>$(ASAN_B)/check-asan.failed; done
	@echo "== check-asan: integration tests (KVB_BIN=$(ASAN_B))"
	@rm -rf $(ASAN_RPT) && mkdir -p $(ASAN_RPT)
	@for t in $(ITEST); do echo "== $$t"; \
	  $(ASAN_ENV_IT) KVB_BIN=$(CURDIR)/$(ASAN_B) timeout 600 bash $$t \
	    || echo "$$t" >>$(ASAN_B)/check-asan.failed; \
	  new=$$(find $(ASAN_RPT) -type f ! -name '*.seen' | sort); \
	  [ -z "$$new" ] || { echo "$$t: sanitizer report(s)" >>$(ASAN_B)/check-asan.failed; \
	    for f in $$new; do echo "== sanitizer report $$f ($$t):"; head -n 60 "$$f"; \
	      mv "$$f" "$$f.seen"; done; }; \
	done
	@echo "== check-asan: fuzz regressions"
	@$(MAKE) --no-print-directory fuzz-regress || echo fuzz-regress >>$(ASAN_B)/check-asan.failed
	@if [ -s $(ASAN_B)/check-asan.failed ]; then \
	  echo "check-asan: failed:"; sed 's/^/  /' $(ASAN_B)/check-asan.failed; exit 1; fi; \
	echo "check-asan: unit, integration and fuzz regressions clean under ASan+UBSan"

check-valgrind-integration: $(PROGS)
	@rm -rf $(VG_B) && mkdir -p $(VG_B)
	@for t in $(notdir $(TOOLS)); do ln -s $(CURDIR)/$(B)/$$t $(VG_B)/$$t; done
	@printf '#!/bin/sh\n# kvbridge under memcheck, for the integration tests (lib.sh: KVB_BIN)\nexec valgrind %s --log-file=%s/vg.%%p.log %s "$$@"\n' \
	  "$(VG_FLAGS)" "$(CURDIR)/$(VG_B)" "$(CURDIR)/$(B)/kvbridge" >$(VG_B)/kvbridge
	@chmod +x $(VG_B)/kvbridge
	@failed=""; bad=0; n=0; for t in $(VG_ITEST); do echo "== valgrind: $$t"; \
	  s=$$(date +%s); \
	  KVB_BIN=$(CURDIR)/$(VG_B) timeout 600 bash $$t || failed="$$failed $$t"; \
	  d=$(VG_B)/$$(basename $$t .sh); mkdir -p $$d; \
	  for f in $(VG_B)/vg.*.log; do [ -e "$$f" ] && mv "$$f" $$d/; done; \
	  k=$$(ls $$d | wc -l); n=$$((n + k)); \
	  echo "   ($$k kvbridge run(s) under memcheck, $$(($$(date +%s) - s)) s)"; \
	  for f in $$d/vg.*.log; do \
	    [ -s "$$f" ] || continue; bad=1; echo "== valgrind report $$f:"; head -n 60 "$$f"; \
	  done; \
	done; \
	[ "$$n" -gt 0 ] || { echo "check-valgrind-integration: kvbridge never ran under valgrind"; exit 1; }; \
	[ $$bad = 0 ] && echo "check-valgrind-integration: $$n kvbridge runs under memcheck, no error, no leak"; \
	[ -z "$$failed" ] || echo "check-valgrind-integration: failed:$$failed"; \
	[ $$bad = 0 ] && [ -z "$$failed" ]

# CI's sanitizer pass: the ASan+UBSan build, every unit test under it (the
# decode/convert/encode/config/state/limits suites and the sink against a real
# nats-server) and the fuzz regressions.  `make check-asan` adds the
# integration tests (slower: run it before a release).
.PHONY: check-asan-unit
check-asan-unit:
	@echo "== check-asan-unit: build ($(ASAN_B), clang $(ASAN_SAN))"
	@$(ASAN_MAKE) all
	@set -e; for t in $(UNIT_SRC:tests/unit/%.c=$(ASAN_B)/tests/%); do echo "== $$t"; \
	  $(ASAN_ENV) $$t; done
	@$(MAKE) --no-print-directory fuzz-regress
	@echo "== check-asan-unit: integration smoke under ASan ($(ASAN_SMOKE))"
	@rm -rf $(ASAN_RPT) && mkdir -p $(ASAN_RPT)
	@set -e; for t in $(ASAN_SMOKE); do echo "== $$t"; \
	  $(ASAN_ENV_IT) KVB_BIN=$(CURDIR)/$(ASAN_B) timeout 600 bash $$t; done; \
	new=$$(find $(ASAN_RPT) -type f | sort); \
	[ -z "$$new" ] || { for f in $$new; do echo "== sanitizer report $$f:"; head -n 60 "$$f"; done; exit 1; }
