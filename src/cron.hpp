/*
 * cron.hpp — cron expressions: parsing, and the next tick after an instant
 * in a time zone.  Plain C++ with no PostgreSQL calls, so every type here is
 * trivially destructible and nothing in it can raise; the time zone comes in
 * as a function from an instant to its UTC offset (schedules.cpp binds it to
 * PostgreSQL's tz database).
 *
 * Syntax: five fields (minute hour day-of-month month day-of-week), or six
 * with a leading seconds field; each a comma list of `*`, `N`, `N-M`, with
 * an optional `/step` (`N/step` is `N-max/step`); months and days of the
 * week also by name (JAN..DEC, SUN..SAT), day of week 0-7 (0 and 7 Sunday).
 * When both day fields are restricted (neither begins with `*`) a day
 * matches if either does (Vixie cron).  Macros: @yearly (@annually),
 * @monthly, @weekly, @daily (@midnight), @hourly; `@every N` (seconds, at
 * multiples of N since the Unix epoch) is parsed by the caller, who has an
 * interval parser, and given to the Expression as every_seconds.
 *
 * Time zones: the expression is matched against wall-clock time, and a
 * matching wall time ticks at the first instant the zone's clock shows it or
 * a later time: one that does not exist (skipped when clocks go forward)
 * at the instant of the change, one that happens twice (clocks go back) at
 * its first occurrence only.  Each wall time so has one instant, whatever
 * instant a search starts from.
 */
#pragma once

#include <cstdint>
#include <optional>

namespace gd::cron {

struct Expression {
    uint64_t seconds = 0;       /* bit s: second s (0-59) */
    uint64_t minutes = 0;       /* bit m: minute m (0-59) */
    uint32_t hours = 0;         /* bit h: hour h (0-23) */
    uint32_t days_of_month = 0; /* bit d: day d (1-31) */
    uint32_t months = 0;        /* bit m: month m (1-12) */
    uint32_t days_of_week = 0;  /* bit d: weekday d (0 Sunday - 6) */
    bool day_of_month_star = false;
    bool day_of_week_star = false;
    int64_t every_seconds = 0; /* > 0: `@every`, the fields unused */
};

/* Why an expression was refused: the field (e.g. "minute"; "" for the whole
 * expression) and the 1-based character position where the trouble is; the
 * message quotes the text in whole characters. */
struct ParseError {
    char field[24];
    int position;
    char message[160];
};

/* Bytes of the character that starts at `character`: the text's encoding
 * (schedules.cpp binds it to the database's), in which the bytes below 0x80
 * are ASCII and nothing else. */
using CharLength = int (*)(const char *character);

/* Parse a field list or macro; false with `error` set when it is malformed
 * or can never match.  `@every` is not parsed here (see above). */
bool parse(const char *text, CharLength char_length, Expression &out, ParseError &error);

/* UTC offset in seconds east of Greenwich at a Unix instant. */
using OffsetAt = long (*)(int64_t instant, const void *zone);

/* The first tick strictly after the Unix instant `after` (whole seconds), in
 * the zone; nullopt if there is none in the next 100 years. */
std::optional<int64_t> next_tick(const Expression &expression, int64_t after, OffsetAt offset_at, const void *zone);

} // namespace gd::cron
