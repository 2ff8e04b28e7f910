# install.mk: `make install` / `make uninstall` (included by the Makefile).
#
#   make install [PREFIX=/usr/local] [DESTDIR=/staging] [SYSCONFDIR=/etc]
#   make uninstall   (same variables)
#
# Installs, under $(DESTDIR):
#   $(BINDIR)/kvbridge, $(BINDIR)/kvbridge-inspect          0755
#   $(LIBEXECDIR)/kvsim, $(LIBEXECDIR)/kvtail               0755 (test and
#       troubleshooting tools: kept out of PATH, their names are too generic)
#   $(UNITDIR)/kvbridge.service, kvbridge@.service          0644, with
#       /usr/local/bin rewritten to $(BINDIR) and /etc to $(SYSCONFDIR)
#   $(SYSCONFDIR)/kvbridge/kvbridge.yaml.example            0644 (every key; a
#       real kvbridge.yaml is never written nor removed)
#   $(MAN8DIR)/kvbridge.8                                   0644
# Then, on the target: systemctl daemon-reload.

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec/kvbridge
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
MAN8DIR    ?= $(PREFIX)/share/man/man8
INSTALL    ?= install

INSTALL_BIN     := kvbridge kvbridge-inspect
INSTALL_LIBEXEC := kvsim kvtail
INSTALL_UNITS   := kvbridge.service kvbridge@.service

# The files `make install` writes (DESTDIR included), for uninstall.
INSTALLED_FILES := $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALL_BIN)) \
                   $(addprefix $(DESTDIR)$(LIBEXECDIR)/,$(INSTALL_LIBEXEC)) \
                   $(addprefix $(DESTDIR)$(UNITDIR)/,$(INSTALL_UNITS)) \
                   $(DESTDIR)$(SYSCONFDIR)/kvbridge/kvbridge.yaml.example \
                   $(DESTDIR)$(MAN8DIR)/kvbridge.8

.PHONY: install uninstall
install: $(addprefix $(B)/,$(INSTALL_BIN) $(INSTALL_LIBEXEC))
	$(INSTALL) -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(UNITDIR) \
	  $(DESTDIR)$(MAN8DIR) $(DESTDIR)$(SYSCONFDIR)/kvbridge
	$(INSTALL) -m 0755 $(addprefix $(B)/,$(INSTALL_BIN)) $(DESTDIR)$(BINDIR)/
	$(INSTALL) -m 0755 $(addprefix $(B)/,$(INSTALL_LIBEXEC)) $(DESTDIR)$(LIBEXECDIR)/
	@set -e; for u in $(INSTALL_UNITS); do \
	  echo "sed systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u"; \
	  sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/etc/kvbridge/|$(SYSCONFDIR)/kvbridge/|g' \
	    systemd/$$u >$(DESTDIR)$(UNITDIR)/$$u.tmp; \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.tmp; \
	  mv -f $(DESTDIR)$(UNITDIR)/$$u.tmp $(DESTDIR)$(UNITDIR)/$$u; \
	done
	$(INSTALL) -m 0644 conf/kvbridge.yaml $(DESTDIR)$(SYSCONFDIR)/kvbridge/kvbridge.yaml.example
	$(INSTALL) -m 0644 docs/kvbridge.8 $(DESTDIR)$(MAN8DIR)/kvbridge.8

# Removes what install wrote, then the directories it made if they are empty
# (never $(SYSCONFDIR)/kvbridge while a configuration is in it).
uninstall:
	rm -f $(INSTALLED_FILES)
	@for d in $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(SYSCONFDIR)/kvbridge; do \
	  rmdir "$$d" 2>/dev/null || true; done

# What install needs built, and no more (debian/rules builds this).
.PHONY: install-progs
install-progs: $(addprefix $(B)/,$(INSTALL_BIN) $(INSTALL_LIBEXEC))
