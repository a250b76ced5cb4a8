# gen_durable — PGXS build.
#   make demo    bootstrap deps, build, install, run the demo on a throwaway cluster
#   make check   bootstrap deps, build, install, run every test suite
#   make         build only (needs pg_config and the build deps)

EXTENSION = gen_durable
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" gen_durable.control)
MODULE_big = gen_durable
# The install script is assembled from sql/src/*.sql, one file per concern,
# every statement written so that it can run again over an existing schema.
# An update from an earlier version X is its migration, sql/upgrade/X--Y.sql
# (what changes in the tables, what cannot be redefined in place), followed
# by the same files.  The scripts of released updates are kept as shipped
# (sql/gen_durable--X--Y.sql, committed).
SQL_SOURCES = $(sort $(wildcard sql/src/*.sql))
UPDATES_BUILT = $(patsubst sql/upgrade/%.sql,sql/gen_durable--%.sql,$(wildcard sql/upgrade/*--$(EXTVERSION).sql))
DATA_built = sql/gen_durable--$(EXTVERSION).sql $(UPDATES_BUILT)
DATA = $(filter-out $(DATA_built),$(wildcard sql/gen_durable--*--*.sql))
OBJS = $(patsubst %.cpp,%.o,$(wildcard src/*.cpp))

PG_CONFIG ?= pg_config

ifneq ($(filter check demo bench,$(MAKECMDGOALS)),)
# These targets bootstrap the machine first, so they must not need PGXS.
.PHONY: check demo bench
check:
	@bash test/scripts/check.sh
demo:
	@bash test/scripts/demo.sh
bench:
	@bash test/bench/run.sh
else
# No LLVM bitcode: the JIT would not inline C++ anyway.
override with_llvm := no
PG_CXXFLAGS = -std=c++17 -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror
SHLIB_LINK = -lstdc++
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
# PGXS tracks no header dependencies: rebuild everything when a header changes.
$(OBJS): $(wildcard src/*.hpp)
sql/gen_durable--$(EXTVERSION).sql: $(SQL_SOURCES)
	cat $^ > $@
sql/gen_durable--%--$(EXTVERSION).sql: sql/upgrade/%--$(EXTVERSION).sql $(SQL_SOURCES)
	cat $^ > $@
# The library knows the version of the SQL it was built for (worker.cpp).
override CPPFLAGS += -DGD_EXTENSION_VERSION='"$(EXTVERSION)"'
# Server headers are not ours: include them as system headers to keep their warnings out.
override CPPFLAGS := $(patsubst -I%,-isystem %,$(CPPFLAGS))
endif
