/*
 * kept_plans.hpp — the engine's own statements (kept_plans.cpp): prepared
 * once per backend (a kept, generic plan) and run as SPI_execute_plan
 * would, planned for the indexes; and the arrays their arguments are made of.
 */
#pragma once

extern "C" {
#include "postgres.h"
#include "executor/spi.h"
}

#include <initializer_list>

SPIPlanPtr gd_prepare_kept(const char *sql, int nargs, Oid *types);
/* How a kept statement joins: as the planner likes, or by hash only (for a
 * statement joining an array of ids to their rows: see kept_plans.cpp). */
enum class KeptJoins { planner_choice, hashed };
int gd_execute_kept(SPIPlanPtr plan, Datum *args, const char *nulls, bool read_only, long count,
                    KeptJoins joins = KeptJoins::planner_choice);
/* Both: run `sql`, prepared into `plan` at its first run. */
int gd_run_kept(SPIPlanPtr &plan, const char *sql, std::initializer_list<Oid> types, Datum *args, bool read_only,
                long count, const char *nulls = nullptr);
/* The same, with the calling SQL function's arguments as the statement's, in their order. */
int gd_run_kept_on_arguments(SPIPlanPtr &plan, const char *sql, std::initializer_list<Oid> types,
                             FunctionCallInfo fcinfo, bool read_only, long count);
/* A one-dimensional array of `count` values of `type` (NULL where nulls says, if given). */
Datum gd_array_of(Datum *values, bool *nulls, int count, Oid type);
