/*
 * rate_limits.hpp — admitting a picked step under its rate limits (rate_limits.cpp).
 */
#pragma once

#include "picker.hpp"
#include "step_definitions.hpp"

/*
 * Take the tokens each of `count` picked steps needs from its rate limits
 * (its instance's and its step's), all in one statement, in their order;
 * push the instances of the steps refused back until their tokens will be
 * there.  admitted[i]: step i may run now (one that names no rate limit
 * always may).
 */
void gd_admit_rates(const PickedInstance *const *rows, const StepDefinition *const *defs, int count, bool *admitted);
