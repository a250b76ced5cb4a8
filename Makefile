# gen_durable — PGXS build.
#   make demo          bootstrap deps, build, install, run the demo on a throwaway cluster
#   make check         bootstrap deps, build, install, run every test suite
#   make installcheck  the regress and isolation suites against a running server (below)
#   make web DSN=...   the web dashboard (gd-web) on 127.0.0.1, as the DSN's role
#   make deb           Debian packages, postgresql-MAJOR-gen-durable (debian/; below)
#   make dist          the PGXN distribution, gen_durable-VERSION.zip (below)
#   make               build only (needs pg_config and the build deps)

EXTENSION = gen_durable
# The sources are in this Makefile's directory: the current one, or another
# in a VPATH build (pg_buildext builds each major in a directory of its own).
# gd_sources: the source files matching the patterns $(1), named relative to it.
GD_SRCDIR := $(dir $(firstword $(MAKEFILE_LIST)))
gd_sources = $(patsubst $(GD_SRCDIR)%,%,$(wildcard $(addprefix $(GD_SRCDIR),$(1))))
# The version, in one place: the control file's default_version.  META.json
# (make dist) and debian/changelog (make deb) are generated from it.
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(GD_SRCDIR)gen_durable.control)
MODULE_big = gen_durable
# The install script is assembled from sql/src/*.sql, one file per concern,
# every statement written so that it can run again over an existing schema.
# An update from an earlier version X is its migration, sql/upgrade/X--Y.sql
# (what changes in the tables, what cannot be redefined in place), followed
# by the same files.  The scripts of released updates are kept as shipped
# (sql/gen_durable--X--Y.sql, committed).
SQL_SOURCES = $(sort $(call gd_sources,sql/src/*.sql))
UPDATES_BUILT = $(patsubst sql/upgrade/%.sql,sql/gen_durable--%.sql,$(call gd_sources,sql/upgrade/*--$(EXTVERSION).sql))
DATA_built = sql/gen_durable--$(EXTVERSION).sql $(UPDATES_BUILT)
DATA = $(filter-out $(DATA_built),$(call gd_sources,sql/gen_durable--*--*.sql))
OBJS = $(patsubst %.cpp,%.o,$(call gd_sources,src/*.cpp))

PG_CONFIG ?= pg_config

# ------------------------------------------------------------------- tests
# One list of tests for both ways of running them:
#   REGRESS    test/sql/NAME.sql    vs expected/NAME.out  (pg_regress)
#   ISOLATION  test/specs/NAME.spec vs expected/NAME.out  (pg_isolation_regress)
# `make check` (test/scripts/check.sh) reads them with `make print-REGRESS`
# and `make print-ISOLATION`, and runs them, then the TAP files of test/t,
# on throwaway servers it starts itself.
#
# `make installcheck` runs them the PGXS way, against a RUNNING server of
# PostgreSQL (15, 17 or 18) with gen_durable installed and the test settings included:
#   include '/path/to/gen_durable/test/pg_test_installcheck.conf'
# in its postgresql.conf (shared_preload_libraries = 'gen_durable', the
# engine serving the databases gd_regress and isolation_regression, fsync
# off: a throwaway server), then, connected as a superuser (the tests create
# roles and run the engine's internals):
#   make installcheck PGUSER=postgres [PGHOST=/tmp PGPORT=5432]
#   make installcheck REGRESS=010_signals        (one regress test alone)
#   make installcheck ISOLATION=signal_dedup     (one isolation spec alone)
#   make installcheck PROVE_TESTS=test/t/000_smoke.pl   (TAP files, below)
# Naming tests of some kinds runs only those.  Each test/sql file runs alone
# or after the others (001_setup's helpers come from
# test/sql/include/setup.sql when missing).  Before the suites, REGRESS_PREP
# drops both databases WITH (FORCE) (the engine's workers stay connected to
# them, which a plain DROP DATABASE waits for in vain) and the test roles a
# failed run may have left.  Outputs: results/, regression.diffs, output_iso/.
# pg_regress 15 reads DIR/sql, DIR/specs and DIR/expected under --inputdir=DIR
# (--expecteddir is 16's): test/expected is a link to the top-level expected/.
# The TAP files start clusters of their own: `make check` runs them (as the
# postgres OS user, with the copies and environment check.sh gives them),
# test/t/run_tap.sh NAME one by one, and `make installcheck` too (TAP_TESTS).
REGRESS = $(sort $(patsubst test/sql/%.sql,%,$(wildcard test/sql/*.sql)))
ISOLATION = $(sort $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec)))
# TAP: test/t/*.pl through PGXS's prove_installcheck, which runs them in the
# checkout (they start clusters of their own: run as a user initdb accepts,
# who may write the checkout's tmp_check/; the Node.js client's TAP files
# want `npm ci` in clients/node first).
TAP_TESTS = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))
# Naming tests of some kinds on the command line runs only those.
NAMED_TESTS = $(filter command line,$(origin REGRESS) $(origin ISOLATION) $(origin PROVE_TESTS))
ifneq ($(NAMED_TESTS),)
ifneq ($(origin REGRESS),command line)
REGRESS =
endif
ifneq ($(origin ISOLATION),command line)
ISOLATION =
endif
ifneq ($(origin PROVE_TESTS),command line)
TAP_TESTS =
endif
endif
# --temp-config counts only with --temp-instance: as the postgres OS user,
#   make installcheck EXTRA_REGRESS_OPTS=--temp-instance=/tmp/gd_tmp_check
# runs the suites on servers pg_regress starts itself (no REGRESS_PREP then).
REGRESS_OPTS = --inputdir=test --temp-config=test/pg_test.conf
ISOLATION_OPTS = --inputdir=test --temp-config=test/pg_test.conf --temp-config=test/pg_test_isolation.conf
NO_LOCALE = 1
ENCODING = UTF8
REGRESS_PREP = installcheck-prep
GD_TEST_DATABASES = gd_regress isolation_regression

ifneq ($(filter check demo bench web deb dist print-REGRESS print-ISOLATION,$(MAKECMDGOALS)),)
# These targets must not need PGXS: check, demo, bench and web bootstrap the
# machine first; deb and dist build on their own (deb with PGXS per major).
.PHONY: check demo bench web deb dist print-REGRESS print-ISOLATION
check:
	@bash test/scripts/check.sh
demo:
	@bash test/scripts/demo.sh
bench:
	@bash test/bench/run.sh
# The dashboard (web/README.md): make web DSN='dbname=app user=gd_dashboard' [PORT=8321]
web:
	@bash web/run.sh "$(DSN)" "$(PORT)"
print-REGRESS print-ISOLATION:
	@echo $($(patsubst print-%,%,$@))
# make deb [DEB_DIR=.build/deb]: the Debian packages, following Debian's
# conventions for PostgreSQL extensions (debian/: pg_buildext), one for each
# major of debian/pgversions the machine's postgresql-server-dev-all supports
# (Debian's own: 15 on bookworm, 17 on trixie), postgresql-MAJOR-gen-durable.
# dpkg-buildpackage builds them in a copy of the source tree,
# DEB_DIR/gen-durable-VERSION, given its debian/changelog (the version, from
# the control file) and debian/control (pg_buildext updatecontrol); the .deb
# files land in DEB_DIR.  Needs dpkg-dev, debhelper, postgresql-server-dev-all
# and libboost-dev.
DEB_DIR = .build/deb
# (debian/control.in's maintainer is META.json's too)
MAINTAINER = $(shell sed -n 's/^Maintainer: //p' debian/control.in)
DEB_SRC = $(DEB_DIR)/gen-durable-$(EXTVERSION)
deb:
	rm -rf '$(DEB_SRC)' && mkdir -p '$(DEB_SRC)'
	tar --exclude=./.git --exclude=./.build --exclude=node_modules --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
	    -cf - . | tar -C '$(DEB_SRC)' -xf -
	printf 'gen-durable (%s) unstable; urgency=medium\n\n  * gen_durable %s.\n\n -- %s  %s\n' \
	    '$(EXTVERSION)' '$(EXTVERSION)' '$(MAINTAINER)' "$$(date -R)" >'$(DEB_SRC)/debian/changelog'
	cd '$(DEB_SRC)' && pg_buildext updatecontrol && \
	    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL dpkg-buildpackage --build=binary --no-sign --jobs-try
# make dist: the PGXN distribution of the commit checked out,
# .build/dist/gen_durable-VERSION.zip, with its META.json made from
# META.json.in (VERSION as SemVer, which PGXN wants: 0.2 is 0.2.0).
PGXN_VERSION = $(shell echo '$(EXTVERSION)' | sed -E 's/^[0-9]+$$/&.0/; s/^[0-9]+\.[0-9]+$$/&.0/')
PGXN_META_SOURCES = META.json.in gen_durable.control debian/control.in
dist: .build/dist/META.json
	@[ -z "$$(git status --porcelain -- $(PGXN_META_SOURCES))" ] || \
	    { echo 'dist: commit $(PGXN_META_SOURCES) first (META.json is made from them)' >&2; exit 1; }
	git archive --format=zip --prefix=$(EXTENSION)-$(PGXN_VERSION)/ --add-file=$< \
	    -o .build/dist/$(EXTENSION)-$(PGXN_VERSION).zip HEAD
	@echo .build/dist/$(EXTENSION)-$(PGXN_VERSION).zip
.build/dist/META.json: $(PGXN_META_SOURCES)
	@mkdir -p $(@D)
	sed -e 's/@VERSION@/$(PGXN_VERSION)/g' -e 's|@MAINTAINER@|$(MAINTAINER)|g' $< >$@
else
# No LLVM bitcode: the JIT would not inline C++ anyway.
override with_llvm := no
PG_CXXFLAGS = -std=c++17 -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror
SHLIB_LINK = -lstdc++
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
# (after Makefile.global, which sets it): GdTest.pm, the TAP files' helpers
PROVE_FLAGS += -I test/t
# PGXS tracks no header dependencies: rebuild everything when a header changes.
$(OBJS): $(call gd_sources,src/*.hpp)
# A VPATH build writes its objects and SQL scripts in directories of its own.
ifdef VPATH
$(shell mkdir -p src sql)
endif
sql/gen_durable--$(EXTVERSION).sql: $(SQL_SOURCES)
	cat $^ > $@
sql/gen_durable--%--$(EXTVERSION).sql: sql/upgrade/%--$(EXTVERSION).sql $(SQL_SOURCES)
	cat $^ > $@
# The library knows the version of the SQL it was built for (worker.cpp).
override CPPFLAGS += -DGD_EXTENSION_VERSION='"$(EXTVERSION)"'
# Server headers are not ours: include them as system headers to keep their warnings out.
override CPPFLAGS := $(patsubst -I%,-isystem %,$(CPPFLAGS))
# The database of the regress suite, the engine's (test/pg_test.conf's
# gen_durable.database); PGXS passes it as the last --dbname.
CONTRIB_TESTDB = gd_regress
.PHONY: installcheck-prep
installcheck-prep:
ifeq ($(findstring --temp-instance,$(EXTRA_REGRESS_OPTS)),)
	@for db in $(GD_TEST_DATABASES); do \
	    '$(bindir)/psql' -X -q -v ON_ERROR_STOP=1 -d postgres -c 'SET client_min_messages = warning' \
	        -c "DROP DATABASE IF EXISTS $$db WITH (FORCE)" || exit 1; \
	done
	@'$(bindir)/psql' -X -q -v ON_ERROR_STOP=1 -d postgres -f test/scripts/drop_test_roles.sql
endif
endif
