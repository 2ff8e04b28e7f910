# deb.mk: the Debian package (included by the Makefile).
#
#   make deps-deb   apt-get install what building the package needs (only when
#                   missing): debhelper, dpkg-dev, lintian (no fakeroot: the
#                   package builds with Rules-Requires-Root: no)
#   make deb        build/kvbridge_VERSION_ARCH.deb, with dpkg-buildpackage
#                   (debhelper, debian/) run on a copy of the tree in
#                   build/deb/kvbridge-VERSION (dpkg-buildpackage writes
#                   next to the tree it builds: build/deb/), then lintian on
#                   it: any error or warning fails (what is left at the info
#                   level, and every override in debian/*lintian-overrides,
#                   says why).  VERSION is include/version.h's, and
#                   debian/changelog must name it.  Rebuilt only when a file
#                   that goes into it changed.
#
# tests/integration/test_ops_deb.sh installs it (dpkg -i), checks it and
# purges it.

DEB_VERSION  := $(shell sed -n 's/^\#define KVB_VERSION "\(.*\)"/\1/p' include/version.h)
DEB_ARCH     := $(shell dpkg --print-architecture 2>/dev/null || echo unknown)
DEB_WORK     := $(B)/deb
DEB_NAME     := kvbridge_$(DEB_VERSION)_$(DEB_ARCH)
DEB_FILE     := $(B)/$(DEB_NAME).deb
# what the package is built from (copied to DEB_WORK)
DEB_TREE     := Makefile README.md mk src include tools docs conf systemd debian
DEB_INPUTS   := $(shell find $(DEB_TREE) -type f 2>/dev/null)
DEB_BUILD_PKGS := debhelper dpkg-dev lintian

.PHONY: deb deps-deb
deb: $(DEB_FILE)

deps-deb:
	$(call apt_install,$(DEB_BUILD_PKGS))

$(DEB_FILE): $(DEB_INPUTS)
	@v=$$(dpkg-parsechangelog -l debian/changelog -S Version); \
	[ "$$v" = "$(DEB_VERSION)" ] || { \
	  echo "deb: debian/changelog says $$v, include/version.h $(DEB_VERSION): add a changelog entry (dch -v $(DEB_VERSION))"; exit 1; }
	rm -rf $(DEB_WORK) && mkdir -p $(DEB_WORK)/kvbridge-$(DEB_VERSION)
	tar -c $(DEB_TREE) | tar -x -C $(DEB_WORK)/kvbridge-$(DEB_VERSION)
	cd $(DEB_WORK)/kvbridge-$(DEB_VERSION) && \
	  DEB_BUILD_OPTIONS="$${DEB_BUILD_OPTIONS:-parallel=2}" dpkg-buildpackage -b -us -uc \
	    >../dpkg-buildpackage.log 2>&1 || \
	  { tail -n 40 ../dpkg-buildpackage.log; echo "deb: dpkg-buildpackage failed (log: $(DEB_WORK)/dpkg-buildpackage.log)"; exit 1; }
	@rc=0; lintian --fail-on error,warning --display-info \
	  $(DEB_WORK)/kvbridge_$(DEB_VERSION)_$(DEB_ARCH).changes >$(DEB_WORK)/lintian.log 2>&1 || rc=$$?; \
	sed 's/^/lintian: /' $(DEB_WORK)/lintian.log; \
	[ $$rc = 0 ] || { echo "deb: lintian found errors or warnings (explain one in debian/kvbridge.lintian-overrides only when it cannot be fixed)"; exit 1; }
	cp $(DEB_WORK)/$(DEB_NAME).deb $@
	@echo "deb: $@"
