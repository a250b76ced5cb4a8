# gen_durable — PGXS build.
#   make demo    bootstrap deps, build, install, run the demo on a throwaway cluster
#   make check   bootstrap deps, build, install, run every test suite
#   make         build only (needs pg_config and the build deps)

EXTENSION = gen_durable
MODULE_big = gen_durable
# The install script is assembled from sql/src/*.sql, one file per concern;
# upgrade scripts (sql/gen_durable--X--Y.sql) are kept as written.
DATA_built = sql/gen_durable--0.1.sql
DATA = $(wildcard sql/gen_durable--*--*.sql)
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
sql/gen_durable--0.1.sql: $(sort $(wildcard sql/src/*.sql))
	cat $^ > $@
# Server headers are not ours: include them as system headers to keep their warnings out.
override CPPFLAGS := $(patsubst -I%,-isystem %,$(CPPFLAGS))
endif
