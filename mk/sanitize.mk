# Sanitizers and valgrind beyond `make check-valgrind` (unit tests, Makefile).
#
#   make check-asan     everything built with clang ASan+UBSan
#                       (-fno-sanitize-recover=all: any report fails) in
#                       build/asan; the unit tests, every integration test
#                       against those binaries (KVB_BIN) and the fuzz
#                       regressions (make fuzz-regress); everything runs, the
#                       failures are listed at the end
#   make check-valgrind-integration
#                       kvbridge (the normal build) under valgrind memcheck in
#                       a few integration scenarios: a wrapper in
#                       build/valgrind-bin starts it as
#                       `valgrind --error-exitcode=99 --leak-check=full`, so a
#                       memory error or a leak at exit makes the test's
#                       "kvbridge exit code 0" check fail; the valgrind
#                       reports are kept in build/valgrind-bin/vg.PID.log

ASAN_B      := build/asan
ASAN_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=all
ASAN_OPT    := -O1 -g -fno-omit-frame-pointer $(ASAN_SAN)
ASAN_MAKE   := $(MAKE) --no-print-directory B=$(ASAN_B) CC=clang OPT="$(ASAN_OPT)" \
               LDFLAGS="$(ASAN_SAN)"
# Leaks are errors; a report stops the process with a non-zero exit.  Check's
# per-test timeouts get room for the slower code.
ASAN_ENV    := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1 \
               UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
               CK_TIMEOUT_MULTIPLIER=4

VG_B        := build/valgrind-bin
VG_ITEST    ?= tests/integration/test_daemon_cli.sh tests/integration/test_limits.sh
VG_FLAGS    := -q --error-exitcode=99 --leak-check=full \
               --errors-for-leak-kinds=definite,indirect,possible

.PHONY: check-asan check-valgrind-integration deps-clang

# clang and its compiler-rt (ASan, UBSan, libFuzzer): apt-get, only when
# missing (like `make deps`)
deps-clang:
	@SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	if ! command -v clang >/dev/null; then \
	  echo "installing: clang"; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q clang; \
	fi; \
	v=$$(clang -dumpversion | cut -d. -f1); \
	if ! ls "$$(clang -print-resource-dir)"/lib/linux/libclang_rt.fuzzer-$$(uname -m).a >/dev/null 2>&1; then \
	  echo "installing: libclang-rt-$$v-dev"; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q libclang-rt-$$v-dev; \
	fi

check-asan:
	@echo "== check-asan: build ($(ASAN_B), clang $(ASAN_SAN))"
	@$(ASAN_MAKE) all
	@rm -f $(ASAN_B)/check-asan.failed
	@echo "== check-asan: unit tests"
	@for t in $(UNIT_SRC:tests/unit/%.c=$(ASAN_B)/tests/%); do echo "== $$t"; \
	  $(ASAN_ENV) $$t || echo "$$t" >>$(ASAN_B)/check-asan.failed; done
	@echo "== check-asan: integration tests (KVB_BIN=$(ASAN_B))"
	@for t in $(ITEST); do echo "== $$t"; \
	  $(ASAN_ENV) KVB_BIN=$(CURDIR)/$(ASAN_B) timeout 600 bash $$t \
	    || echo "$$t" >>$(ASAN_B)/check-asan.failed; done
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
	@failed=""; for t in $(VG_ITEST); do echo "== valgrind: $$t"; \
	  KVB_BIN=$(CURDIR)/$(VG_B) timeout 600 bash $$t || failed="$$failed $$t"; done; \
	bad=0; for f in $(VG_B)/vg.*.log; do \
	  [ -s "$$f" ] || continue; bad=1; echo "== valgrind report $$f:"; head -n 60 "$$f"; \
	done; \
	n=$$(ls $(VG_B)/vg.*.log 2>/dev/null | wc -l); \
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
