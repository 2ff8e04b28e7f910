# Static checks (CI runs `make lint` after `make check`):
#
#   make lint         shellcheck on every shell script of the tests and tools
#                     and on .ci/run
#                     (settings in .shellcheckrc) and cppcheck on src/ and
#                     tools/ (LINT_CPPCHECK_FLAGS; suppressions: inline
#                     `// cppcheck-suppress ID` with a reason, or
#                     mk/cppcheck.supp); any finding fails
#   make lint-sh, make lint-c   one of the two
#   make deps-lint    apt-get install shellcheck and cppcheck when missing
#
# The C style for editors and new code is .clang-format (not enforced here).

LINT_SH   := .ci/run $(sort $(wildcard tests/integration/*.sh tests/bench/*.sh tests/fuzz/*.sh tools/*.sh))
LINT_C    := src tools
LINT_CPPCHECK_FLAGS := -q --std=c11 --enable=warning,performance,portability \
                       --error-exitcode=1 --inline-suppr --suppress=missingIncludeSystem \
                       --suppressions-list=mk/cppcheck.supp -D_GNU_SOURCE -Iinclude

.PHONY: lint lint-sh lint-c deps-lint

lint: lint-sh lint-c

lint-sh:
	@echo "== shellcheck ($(words $(LINT_SH)) scripts)"
	@shellcheck $(LINT_SH)

lint-c:
	@echo "== cppcheck $(LINT_C)"
	@cppcheck $(LINT_CPPCHECK_FLAGS) $(LINT_C)

deps-lint:
	$(call apt_install,shellcheck cppcheck)
