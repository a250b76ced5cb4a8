/*
 * cron.cpp — cron expressions (cron.hpp): the parser, and the next tick by
 * wall-clock time, turned into an instant through the zone's UTC offsets.
 */
#include "cron.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

namespace gd::cron {

namespace {

struct FieldSpec {
    const char *name;
    int min;
    int max;
    const char *const *names; /* names of min, min+1, ...; nullptr: numbers only */
};

const char *const MONTH_NAMES[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                   "JUL", "AUG", "SEP", "OCT", "NOV", "DEC", nullptr};
const char *const WEEKDAY_NAMES[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", nullptr};

const FieldSpec SECOND{"second", 0, 59, nullptr};
const FieldSpec MINUTE{"minute", 0, 59, nullptr};
const FieldSpec HOUR{"hour", 0, 23, nullptr};
const FieldSpec DAY_OF_MONTH{"day-of-month", 1, 31, nullptr};
const FieldSpec MONTH{"month", 1, 12, MONTH_NAMES};
const FieldSpec DAY_OF_WEEK{"day-of-week", 0, 7, WEEKDAY_NAMES};

struct Macro {
    const char *name;
    const char *fields;
};
const Macro MACROS[] = {{"@yearly", "0 0 1 1 *"},  {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
                        {"@weekly", "0 0 * * 0"},  {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
                        {"@hourly", "0 * * * *"}};

constexpr int MAX_FIELDS = 6;
constexpr int64_t SECONDS_PER_DAY = 86400;
constexpr int64_t HUNDRED_YEARS = 100 * 366 * SECONDS_PER_DAY;
constexpr int64_t AROUND = 36 * 3600; /* a zone's offset before and after an instant */
constexpr int QUOTED_BYTES = 24;       /* of the expression's text, quoted in a message */

/* The text being parsed, and how long its characters are. */
struct Source {
    const char *text;
    CharLength char_length;
};

/* text[from, to) for a message: whole characters, at most QUOTED_BYTES of them, then "...". */
void quote(const Source &source, int from, int to, char (&out)[QUOTED_BYTES + 4])
{
    int at = from;
    while (at < to) {
        int length = source.char_length(source.text + at);
        if (at + length > to || at + length - from > QUOTED_BYTES)
            break;
        at += length;
    }
    snprintf(out, sizeof(out), "%.*s%s", at - from, source.text + from, at < to ? "..." : "");
}

/* Refuse the expression at byte `at` of the text: the position counts characters. */
bool fail(ParseError &error, const Source &source, const char *field, int at, const char *message)
{
    int position = 1;
    for (int i = 0; i < at; i += source.char_length(source.text + i))
        position++;
    snprintf(error.field, sizeof(error.field), "%s", field);
    error.position = position;
    snprintf(error.message, sizeof(error.message), "%s", message);
    return false;
}

/* A number or (where the field has names) a name at text[*at], advancing *at. */
bool parse_value(const Source &source, int &at, int end, const FieldSpec &spec, int &value, ParseError &error)
{
    const char *text = source.text;
    char message[160];
    int start = at;
    if (at < end && isdigit(static_cast<unsigned char>(text[at]))) {
        long number = 0;
        while (at < end && isdigit(static_cast<unsigned char>(text[at])) && number < 1000)
            number = number * 10 + (text[at++] - '0');
        if (number < spec.min || number > spec.max) {
            snprintf(message, sizeof(message), "%.*s is out of range %d-%d", at - start, text + start, spec.min,
                     spec.max);
            return fail(error, source, spec.name, start, message);
        }
        value = static_cast<int>(number);
        return true;
    }
    /* A word: letters, and other characters than ASCII, so that a message names them whole. */
    while (at < end && (isalpha(static_cast<unsigned char>(text[at])) || static_cast<unsigned char>(text[at]) >= 0x80))
        at += source.char_length(text + at);
    if (at > start && spec.names != nullptr) {
        for (int i = 0; spec.names[i] != nullptr; i++)
            if (at - start == 3 && strncasecmp(text + start, spec.names[i], 3) == 0) {
                value = spec.min + i;
                return true;
            }
    }
    if (at == start && at == end)
        return fail(error, source, spec.name, start, "a value is missing");
    if (at == start)
        at++; /* name the character: an ASCII one, the others make words */
    char quoted[QUOTED_BYTES + 4];
    quote(source, start, at, quoted);
    snprintf(message, sizeof(message), "unexpected \"%s\"%s", quoted, spec.names ? "" : " (numbers only)");
    return fail(error, source, spec.name, start, message);
}

/* One field, text[start, end): a comma list of * | N | N-M, each with an optional /step. */
bool parse_field(const Source &source, int start, int end, const FieldSpec &spec, uint64_t &bits, ParseError &error)
{
    const char *text = source.text;
    char message[160];
    int at = start;
    for (;;) {
        int item = at;
        int low = spec.min, high = spec.max;
        bool star = at < end && text[at] == '*';
        bool ranged = star;
        if (star) {
            at++;
        } else {
            if (!parse_value(source, at, end, spec, low, error))
                return false;
            high = low;
            if (at < end && text[at] == '-') {
                at++;
                ranged = true;
                if (!parse_value(source, at, end, spec, high, error))
                    return false;
                if (high < low) {
                    snprintf(message, sizeof(message), "range %d-%d runs backwards", low, high);
                    return fail(error, source, spec.name, item, message);
                }
            }
        }
        int step = 1;
        if (at < end && text[at] == '/') {
            int step_at = ++at;
            long number = 0;
            while (at < end && isdigit(static_cast<unsigned char>(text[at])) && number < 1000)
                number = number * 10 + (text[at++] - '0');
            if (at == step_at || number < 1 || number > spec.max) {
                snprintf(message, sizeof(message), "a step must be a number from 1 to %d", spec.max);
                return fail(error, source, spec.name, step_at, message);
            }
            step = static_cast<int>(number);
            if (!ranged)
                high = spec.max; /* N/step: from N to the end */
        }
        for (int v = low; v <= high; v += step)
            bits |= uint64_t{1} << v;
        if (at == end)
            return true;
        if (text[at] != ',') {
            char quoted[QUOTED_BYTES + 4];
            quote(source, at, at + source.char_length(text + at), quoted);
            snprintf(message, sizeof(message), "unexpected \"%s\"", quoted);
            return fail(error, source, spec.name, at, message);
        }
        if (++at == end)
            return fail(error, source, spec.name, at - 1, "a list must not end with a comma");
    }
}

int days_in_month(int64_t year, unsigned month)
{
    static const int DAYS[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return month == 2 && leap ? 29 : DAYS[month - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date, and back (H. Hinnant's algorithms). */
int64_t days_from_civil(int64_t year, unsigned month, unsigned day)
{
    year -= month <= 2;
    int64_t era = (year >= 0 ? year : year - 399) / 400;
    unsigned year_of_era = static_cast<unsigned>(year - era * 400);
    unsigned day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    unsigned day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    return era * 146097 + static_cast<int64_t>(day_of_era) - 719468;
}

void civil_from_days(int64_t days, int64_t &year, unsigned &month, unsigned &day)
{
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    unsigned day_of_era = static_cast<unsigned>(days - era * 146097);
    unsigned year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
    unsigned day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    unsigned mp = (5 * day_of_year + 2) / 153;
    day = day_of_year - (153 * mp + 2) / 5 + 1;
    month = mp < 10 ? mp + 3 : mp - 9;
    year = static_cast<int64_t>(year_of_era) + era * 400 + (month <= 2);
}

int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

bool day_matches(const Expression &e, unsigned day, int64_t days_since_epoch)
{
    int weekday = static_cast<int>(((days_since_epoch + 4) % 7 + 7) % 7); /* 1970-01-01 was a Thursday */
    bool by_month_day = e.days_of_month & (uint32_t{1} << day);
    bool by_weekday = e.days_of_week & (uint32_t{1} << weekday);
    if (e.day_of_month_star || e.day_of_week_star)
        return by_month_day && by_weekday;
    return by_month_day || by_weekday;
}

/* The lowest set bit of `bits` at or above `from`, or -1. */
int next_bit(uint64_t bits, int from)
{
    if (from >= 64)
        return -1;
    uint64_t rest = bits & (~uint64_t{0} << from);
    return rest == 0 ? -1 : __builtin_ctzll(rest);
}

/* The first wall-clock second after `after` (seconds since 1970-01-01 00:00 local) that matches. */
std::optional<int64_t> next_wall(const Expression &e, int64_t after, int64_t horizon)
{
    int64_t t = after + 1;
    while (t <= horizon) {
        int64_t days = floor_div(t, SECONDS_PER_DAY);
        int64_t second_of_day = t - days * SECONDS_PER_DAY;
        int64_t year;
        unsigned month, day;
        civil_from_days(days, year, month, day);
        if (!(e.months & (uint32_t{1} << month))) {
            if (++month > 12) {
                month = 1;
                year++;
            }
            t = days_from_civil(year, month, 1) * SECONDS_PER_DAY;
            continue;
        }
        if (!day_matches(e, day, days)) {
            t = (days + 1) * SECONDS_PER_DAY;
            continue;
        }
        int hour = static_cast<int>(second_of_day / 3600);
        int minute = static_cast<int>(second_of_day / 60 % 60);
        int second = static_cast<int>(second_of_day % 60);
        int h = next_bit(e.hours, hour);
        if (h != hour) {
            t = h < 0 ? (days + 1) * SECONDS_PER_DAY : days * SECONDS_PER_DAY + h * 3600;
            continue;
        }
        int m = next_bit(e.minutes, minute);
        if (m != minute) {
            t = m < 0 ? days * SECONDS_PER_DAY + (hour + 1) * 3600 : days * SECONDS_PER_DAY + hour * 3600 + m * 60;
            continue;
        }
        int s = next_bit(e.seconds, second);
        if (s != second) {
            t = s < 0 ? t - second + 60 : t - second + s;
            continue;
        }
        return t;
    }
    return std::nullopt;
}

/* Can the day fields ever match?  Only day-of-month alone can fail (30 FEB). */
bool days_can_match(const Expression &e)
{
    if (e.day_of_month_star || !e.day_of_week_star)
        return true;
    for (unsigned month = 1; month <= 12; month++)
        if (e.months & (uint32_t{1} << month))
            for (int day = 1; day <= days_in_month(2000, month); day++)
                if (e.days_of_month & (uint32_t{1} << day))
                    return true;
    return false;
}

/* The first instant in (low, high] whose offset is not `offset`, low's: where the zone changes. */
int64_t change_after(int64_t low, int64_t high, long offset, OffsetAt offset_at, const void *zone)
{
    while (high - low > 1) {
        int64_t middle = low + (high - low) / 2;
        (offset_at(middle, zone) == offset ? low : high) = middle;
    }
    return high;
}

/* The latest wall time the zone's clock has shown by `after`: while a change back repeats an hour, the
 * one just before the change. */
int64_t latest_wall(int64_t after, OffsetAt offset_at, const void *zone)
{
    long now = offset_at(after, zone), before = offset_at(after - AROUND, zone);
    int64_t wall = after + now;
    if (before > now)
        wall = std::max(wall, change_after(after - AROUND, after, before, offset_at, zone) - 1 + before);
    return wall;
}

/* The instant a wall time ticks at: the first at which the clock shows it or a later time; nullopt where
 * the zone changes too often around it to tell. */
std::optional<int64_t> first_reached(int64_t wall, OffsetAt offset_at, const void *zone)
{
    /* The instants with this wall time: at most one per offset the zone has around it. */
    long offsets[3] = {offset_at(wall - AROUND, zone), offset_at(wall, zone), offset_at(wall + AROUND, zone)};
    std::optional<int64_t> first;
    for (long offset : offsets) {
        int64_t instant = wall - offset;
        if (offset_at(instant, zone) == offset && (!first || instant < *first))
            first = instant;
    }
    if (first)
        return first;
    /* None: skipped by clocks going forward, it ticks at the change, in (wall - later, wall - before]. */
    long before = offsets[0], later = offsets[2];
    if (later > before && offset_at(wall - later, zone) == before && offset_at(wall - before, zone) == later)
        return change_after(wall - later, wall - before, before, offset_at, zone);
    return std::nullopt;
}

} // namespace

bool parse(const char *text, CharLength char_length, Expression &out, ParseError &error)
{
    out = Expression{};
    Source source{text, char_length};
    int offset = 0; /* a macro's fields report positions in the macro itself */
    while (isspace(static_cast<unsigned char>(text[offset])))
        offset++;
    if (text[offset] == '@') {
        int end = offset;
        while (text[end] != '\0' && !isspace(static_cast<unsigned char>(text[end])))
            end++;
        const Macro *found = nullptr;
        for (const Macro &macro : MACROS)
            if (strlen(macro.name) == static_cast<size_t>(end - offset) &&
                strncasecmp(text + offset, macro.name, end - offset) == 0)
                found = &macro;
        char message[160];
        if (found == nullptr) {
            char quoted[QUOTED_BYTES + 4];
            quote(source, offset, end, quoted);
            snprintf(message, sizeof(message),
                     "unknown macro \"%s\" (@yearly, @annually, @monthly, @weekly, @daily, @midnight, "
                     "@hourly, @every <interval>)", quoted);
            return fail(error, source, "", offset, message);
        }
        while (isspace(static_cast<unsigned char>(text[end])))
            end++;
        if (text[end] != '\0') {
            snprintf(message, sizeof(message), "%s takes nothing after it", found->name);
            return fail(error, source, "", end, message);
        }
        source.text = found->fields;
    }
    const char *fields = source.text;

    int starts[MAX_FIELDS + 1], ends[MAX_FIELDS + 1];
    int count = 0;
    for (int at = 0;;) {
        while (isspace(static_cast<unsigned char>(fields[at])))
            at++;
        if (fields[at] == '\0')
            break;
        if (count == MAX_FIELDS)
            return fail(error, source, "", at, "too many fields: 5 (minute hour day-of-month month day-of-week), "
                                               "or 6 with a leading second");
        starts[count] = at;
        while (fields[at] != '\0' && !isspace(static_cast<unsigned char>(fields[at])))
            at++;
        ends[count++] = at;
    }
    if (count < 5) {
        char message[160];
        snprintf(message, sizeof(message),
                 "%d field%s: 5 are needed (minute hour day-of-month month day-of-week), or 6 with a leading second",
                 count, count == 1 ? "" : "s");
        return fail(error, source, "", static_cast<int>(strlen(fields)), message);
    }
    const FieldSpec *specs[MAX_FIELDS] = {&SECOND, &MINUTE, &HOUR, &DAY_OF_MONTH, &MONTH, &DAY_OF_WEEK};
    uint64_t bits[MAX_FIELDS] = {uint64_t{1}, 0, 0, 0, 0, 0}; /* five fields: second 0 */
    int first = MAX_FIELDS - count;
    for (int i = 0; i < count; i++) {
        const FieldSpec &spec = *specs[first + i];
        bits[first + i] = 0;
        if (!parse_field(source, starts[i], ends[i], spec, bits[first + i], error)) {
            if (fields != text)
                error.position = 1; /* inside a macro: the macro is at fault */
            return false;
        }
    }
    out.seconds = bits[0];
    out.minutes = bits[1];
    out.hours = static_cast<uint32_t>(bits[2]);
    out.days_of_month = static_cast<uint32_t>(bits[3]);
    out.months = static_cast<uint32_t>(bits[4]);
    out.days_of_week = static_cast<uint32_t>((bits[5] | (bits[5] >> 7)) & 0x7f); /* 7 is Sunday too */
    out.day_of_month_star = fields[starts[count - 3]] == '*';
    out.day_of_week_star = fields[starts[count - 1]] == '*';
    if (!days_can_match(out))
        return fail(error, source, "day-of-month", starts[count - 3],
                    "never matches: no month of the expression has such a day");
    return true;
}

std::optional<int64_t> next_tick(const Expression &e, int64_t after, OffsetAt offset_at, const void *zone)
{
    if (e.every_seconds > 0)
        return (floor_div(after, e.every_seconds) + 1) * e.every_seconds;

    /* Every wall time up to the latest shown by `after` ticked by then (cron.hpp): the next tick is the
     * next matching wall time's. */
    int64_t wall = latest_wall(after, offset_at, zone);
    int64_t horizon = wall + HUNDRED_YEARS;
    for (;;) {
        std::optional<int64_t> next = next_wall(e, wall, horizon);
        if (!next)
            return std::nullopt;
        wall = *next;
        /* After `after` unless the zone changes more than once in AROUND: the next wall time then. */
        std::optional<int64_t> tick = first_reached(wall, offset_at, zone);
        if (tick && *tick > after)
            return tick;
    }
}

} // namespace gd::cron
