/*
 * rate_limits.hpp — admitting a picked step under its rate limits (rate_limits.cpp).
 */
#pragma once

#include "picker.hpp"
#include "step_definitions.hpp"

/*
 * Take the tokens a step needs from its rate limits (the instance's and the
 * step's), or push the instance back until they will be there; false when
 * the step must not run now.
 */
bool gd_admit_rate(const PickedInstance &row, const StepDefinition &def);
