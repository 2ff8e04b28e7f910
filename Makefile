# kvbridge: plain Makefile, pkg-config for every library (docs/design.md rule 12).
# Binaries go to build/.  `make deps` installs missing Debian packages.

CC       ?= cc
PKGS     := libzmq msgpack libnats yaml-0.1 libxxhash libmicrohttpd libsystemd libcrypto libcurl json-c
OPT      ?= -O2 -g
# Third-party headers come in through -isystem (pkg-config), so -Werror only
# applies to our own code.
# include/: the headers that cross src/ folders.  A folder's private headers
# sit beside its files (found by #include "x.h" from there); the tests, fuzz
# targets, benches and kvbridge-inspect reach one as "folder/x.h" (-Isrc).
CPPFLAGS += -Iinclude -D_GNU_SOURCE
PRIV_CPPFLAGS := -Isrc
CFLAGS   += -std=c11 $(OPT) -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
            -Wmissing-prototypes -MMD -MP \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread -lm
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   := $(shell pkg-config --libs check 2>/dev/null)

B        ?= build
LIB_SRC  := $(sort $(wildcard src/*/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/obj/%.o)
TOOLS    := $(B)/kvbridge-inspect $(patsubst tools/%.c,$(B)/%,$(filter-out tools/inspect.c,$(wildcard tools/*.c)))
# The tests' oracle: kvsim and kvtail use nothing from src/ (no -Iinclude, no
# libkvb.a: an #include of a daemon header or a call into it does not build);
# what they share is tools/tools_common.h.
ORACLE   := $(B)/kvsim $(B)/kvtail
ORACLE_CPPFLAGS := -D_GNU_SOURCE
PROGS    := $(if $(wildcard src/main.c),$(B)/kvbridge) $(TOOLS)
UNIT_SRC := $(wildcard tests/unit/check_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/%)
ITEST    := $(sort $(wildcard tests/integration/test_*.sh))

DEB_PKGS := gcc make pkg-config git libzmq3-dev libmsgpack-dev libnats-dev libyaml-dev \
            check libxxhash-dev libmicrohttpd-dev libsystemd-dev libssl-dev nats-server valgrind \
            systemd strace openssl curl libcurl4-openssl-dev \
            libjson-c-dev etcd-server etcd-client man-db groff-base

# keep objects of pattern-built binaries
.SECONDARY:

.PHONY: all check unit integration integration-msgpack tools-selftest check-valgrind deps clean demo \
        soak soak-ci check-deps
all: $(PROGS) $(UNIT_BIN)

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(B)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(PRIV_CPPFLAGS) $(CFLAGS) $(CHECK_CFLAGS) -c -o $@ $<

$(B)/obj/tools/inspect.o: tools/inspect.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(PRIV_CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(B)/libkvb.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/kvbridge: $(B)/obj/src/main.o $(B)/libkvb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/kvbridge-inspect: $(B)/obj/tools/inspect.o $(B)/libkvb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(ORACLE:$(B)/%=$(B)/obj/tools/%.o): $(B)/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ORACLE_CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(ORACLE): $(B)/%: $(B)/obj/tools/%.o
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/%: $(B)/obj/tools/%.o $(B)/libkvb.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/%: $(B)/obj/tests/unit/%.o $(B)/libkvb.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CHECK_LIBS)

# Unit tests run from the project root (they read tests/data/).
unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

# Every test runs (300 s each at most); the failed ones are listed, then
# "integration: N passed, N failed".  One test: timeout 300 bash tests/integration/test_X.sh
integration: $(PROGS)
	@bash tests/integration/run.sh $(ITEST)

# The test instruments kvsim and kvtail tested on their own (tools/README.md).
tools-selftest: $(ORACLE)
	@bash tests/integration/tools_selftest.sh

# The tests whose configs and kvtail follow KVB_FORMAT (tests/integration/lib.sh),
# run with nats.format dynamo-msgpack (batched): make integration-msgpack
MSGPACK_ITEST := $(addprefix tests/integration/,test_daemon_gaps.sh test_daemon_replay.sh \
                   test_daemon_restart.sh test_daemon_dp.sh test_daemon_nats_down.sh \
                   test_rel_jetstream.sh test_daemon_malformed.sh test_daemon_encodings.sh \
                   test_daemon_idle.sh test_discovery_etcd.sh test_rel_repair.sh)

integration-msgpack: $(PROGS)
	@set -e; for t in $(MSGPACK_ITEST); do echo "== $$t (dynamo-msgpack)"; \
	  KVB_FORMAT=dynamo-msgpack timeout 300 bash $$t; done

# Soak (tests/integration/soak.sh): SOAK_SECONDS of 1000 batches/s through
# JetStream on a 3-node cluster with engine restarts, NATS restarts, a node
# killed, SIGHUP reloads and live drops; one summary table.  soak-ci: the
# short variant CI runs (.ci/run).
SOAK_SECONDS ?= 300
soak: $(PROGS)
	@SOAK_SECONDS=$(SOAK_SECONDS) timeout $$(( $(SOAK_SECONDS) * 2 + 300 )) bash tests/integration/soak.sh

soak-ci: $(PROGS)
	@SOAK_SECONDS=75 timeout 600 bash tests/integration/soak.sh

# On a fresh Debian machine this installs what the build and the tests need
# (the package test builds a .deb: deps-deb), then builds.
check:
	@$(MAKE) --no-print-directory deps deps-deb
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory tools-selftest
	@$(MAKE) --no-print-directory integration

# Every unit test under memcheck: any leak or error fails.
check-valgrind: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== valgrind $$t"; \
	  CK_FORK=no valgrind -q --error-exitcode=99 --leak-check=full \
	    --errors-for-leak-kinds=definite,indirect,possible $$t; done

# $(call apt_install,PACKAGES): apt-get install those of PACKAGES that are
# missing (nothing, not even apt-get update, when none is); root or sudo.
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi
endef

deps:
	$(call apt_install,$(DEB_PKGS))

# Every program a script of tests/, tools/ or .ci/ runs comes from a package
# that a deps target installs (or that every Debian system has): a program
# installed by hand would pass here and fail on a fresh machine.  .ci/run
# runs it after the deps targets (mk/check-deps.sh).
ALL_PKGS = $(DEB_PKGS) $(DEB_BUILD_PKGS) $(LINT_PKGS) $(CLANG_PKGS)
check-deps:
	@echo "== check-deps"
	@PKGS="$(ALL_PKGS)" bash mk/check-deps.sh .ci/run $(sort $(wildcard tests/*/*.sh tools/*.sh))

demo: deps
	@$(MAKE) --no-print-directory all
	bash tools/demo.sh

clean:
	rm -rf $(B)

# Feature makefiles (fuzz, sanitizers, bench, install) live in mk/*.mk.
include $(sort $(wildcard mk/*.mk))

# (not under $(B)/deb: make deb's copy of the tree, with its own build and
# directories such as tmpfiles.d)
-include $(shell find $(B) -path $(B)/deb -prune -o -type f -name '*.d' -print 2>/dev/null)
