/*
 * crashed_steps.hpp — steps that end their executor (crashed_steps.cpp).
 * An executor installs its SIGTERM/SIGQUIT handlers at start, opens its
 * slot's note once its database is served, and notes each step around its
 * handler call; the workers of a database count the notes dead executors left.
 */
#pragma once

#include "picker.hpp"

void gd_install_step_note_handlers();
void gd_open_step_note(int slot_index);
void gd_note_step(const PickedInstance &row, int timeout_ms);
void gd_note_step_ended();
/* Count the notes of this database's dead executors; true when one is left for later (its row is running). */
bool gd_count_crashed_steps();
