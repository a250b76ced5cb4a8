/*
 * step_records.hpp — what a finished step leaves behind (step_records.cpp):
 * its counts in gd.stats and gd.step_stats and, when its FSM version keeps
 * a history, its row of gd._step_history.
 */
#pragma once

#include "transition.hpp"

/*
 * Count a finished step (a lost attempt is not counted) and write its history row: into `batch` when given
 * (written by gd_write_history, one INSERT for a batch of transitions),
 * else at once.
 */
struct HistoryBatch;
HistoryBatch *gd_begin_history(int capacity);
void gd_record_finished_step(int64 id, const Transition &t, HistoryBatch *batch = nullptr);
void gd_write_history(HistoryBatch *batch);
