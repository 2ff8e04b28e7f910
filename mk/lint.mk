# Static checks (CI runs `make lint` after `make check`):
#
#   make lint         shellcheck on every shell script of the tests and tools
#                     and on .ci/run
#                     (settings in .shellcheckrc) and cppcheck on src/ and
#                     tools/ (LINT_CPPCHECK_FLAGS: style, warning,
#                     performance, portability); any finding fails; a
#                     false positive is suppressed inline only, on the line
#                     before it: `// cppcheck-suppress ID ; the reason`
#                     and clang-format (.clang-format) on every C file
#                     git tracks: a file it would change fails
#                     and the call graph between the files of src/ (nm on
#                     their objects, built first): a cycle fails, naming
#                     the files (mk/file-graph.sh)
#   make lint-sh, make lint-c, make lint-format, make lint-graph   one of them
#   make format       rewrite the C files in the style (clang-format -i)
#   make deps-lint    apt-get install shellcheck, cppcheck and clang-format
#                     when missing

LINT_SH   := .ci/run mk/check-deps.sh mk/file-graph.sh $(sort $(wildcard tests/integration/*.sh tests/bench/*.sh tests/fuzz/*.sh tools/*.sh))
LINT_C    := src tools
LINT_CPPCHECK_FLAGS := -q --std=c11 --enable=style,warning,performance,portability \
                       --error-exitcode=1 --inline-suppr --suppress=missingIncludeSystem \
                       -D_GNU_SOURCE -Iinclude

LINT_FMT  = $(shell git ls-files '*.c' '*.h' 2>/dev/null)

.PHONY: lint lint-sh lint-c lint-format lint-graph format deps-lint

lint: lint-sh lint-c lint-format lint-graph

lint-sh:
	@echo "== shellcheck ($(words $(LINT_SH)) scripts)"
	@shellcheck $(LINT_SH)

lint-c:
	@echo "== cppcheck $(LINT_C)"
	@cppcheck $(LINT_CPPCHECK_FLAGS) $(LINT_C)

lint-format:
	@echo "== clang-format ($(words $(LINT_FMT)) files)"
	@clang-format --dry-run --Werror $(LINT_FMT)

lint-graph: $(LIB_OBJ)
	@echo "== file graph ($(words $(LIB_OBJ)) files of src/)"
	@bash mk/file-graph.sh $(LIB_OBJ)

format:
	@clang-format -i $(LINT_FMT)

LINT_PKGS := shellcheck cppcheck clang-format
deps-lint:
	$(call apt_install,$(LINT_PKGS))
