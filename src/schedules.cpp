/*
 * schedules.cpp — the SQL face of cron expressions (cron.hpp): validating a
 * schedule's timing (`@every <interval>` parsed here, with PostgreSQL's
 * interval input) and time zone (PostgreSQL's tz database), and its ticks:
 * gd_cron_ticks for users, gd._cron_next and gd._cron_missed for the reaper
 * firing schedules (sql/src/68_schedules.sql).
 */
#include "cron.hpp"
#include "gen_durable.hpp"
#include "guard.hpp"

#include <cctype>

extern "C" {
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgtime.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace {

constexpr int64 UNIX_EPOCH_IN_PG_SECONDS = (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
constexpr int64 MAX_EVERY_SECONDS = int64{100} * 366 * SECS_PER_DAY;
/* A tick enumeration gives up (and says so) past this many ticks. */
constexpr int64 MAX_TICKS_COUNTED = 10000000;

const char *const EVERY = "@every";

/* A schedule's timing and zone, checked. */
struct Timing {
    gd::cron::Expression expression;
    pg_tz *zone;
};

[[noreturn]] void refuse_cron(const char *cron, const char *field, int position, const char *message)
{
    if (field[0] != '\0')
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: cron expression \"%s\": %s field at position %d: %s", cron, field,
                               position, message)));
    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                    errmsg("gen_durable: cron expression \"%s\" at position %d: %s", cron, position, message)));
}

/* `@every <interval>`: whole seconds, at least one, no months (their length varies). */
int64 parse_every(const char *cron, const char *interval_text)
{
    Interval *volatile every = nullptr;
    MemoryContext caller_context = CurrentMemoryContext;
    PG_TRY();
    {
        every = DatumGetIntervalP(DirectFunctionCall3(interval_in, CStringGetDatum(interval_text),
                                                      ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1)));
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(caller_context);
        FlushErrorState();
    }
    PG_END_TRY();
    int position = pg_mbstrlen_with_len(cron, static_cast<int>(interval_text - cron)) + 1;
    if (every == nullptr)
        refuse_cron(cron, "", position, "@every needs an interval, e.g. @every 30 seconds");
    int64 microseconds = every->time + static_cast<int64>(every->day) * USECS_PER_DAY;
    if (every->month != 0 || microseconds % USECS_PER_SEC != 0 || microseconds < USECS_PER_SEC ||
        microseconds / USECS_PER_SEC > MAX_EVERY_SECONDS)
        refuse_cron(cron, "", position, "@every takes whole seconds from 1 second to 100 years, and no months");
    return microseconds / USECS_PER_SEC;
}

/* A zone that is only an offset ("-7", "+05:30"): SET TIME ZONE reads "-7" as UTC-07:00, pg_tzset (POSIX,
 * and AT TIME ZONE) as UTC+07:00. */
bool bare_offset(const char *zone)
{
    zone += strspn(zone, " \t\n\r\f\v");
    return *zone == '+' || *zone == '-' || *zone == '.' || isdigit(static_cast<unsigned char>(*zone));
}

Timing check_timing(text *cron_text, text *zone_text)
{
    Timing timing{};
    char *cron = text_to_cstring(cron_text);
    const char *start = cron;
    while (isspace(static_cast<unsigned char>(*start)))
        start++;
    size_t every_length = strlen(EVERY);
    if (pg_strncasecmp(start, EVERY, every_length) == 0 &&
        (start[every_length] == '\0' || isspace(static_cast<unsigned char>(start[every_length])))) {
        timing.expression.every_seconds = parse_every(cron, start + every_length);
    } else {
        gd::cron::ParseError error;
        if (!gd::cron::parse(cron, pg_mblen, timing.expression, error))
            refuse_cron(cron, error.field, error.position, error.message);
    }
    char *zone_name = text_to_cstring(zone_text);
    if (bare_offset(zone_name))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: time zone \"%s\" is a bare UTC offset, whose sign SET TIME ZONE reads "
                               "one way and POSIX the other", zone_name),
                        errhint("Name the zone, e.g. America/Denver; for a fixed offset, POSIX signs count west of "
                                "Greenwich: Etc/GMT+7 and <-07>7 are UTC-07:00.")));
    timing.zone = zone_name[0] == '\0' ? nullptr : pg_tzset(zone_name);
    if (timing.zone == nullptr || !pg_tz_acceptable(timing.zone))
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: unknown time zone \"%s\"", zone_name),
                        errhint("Name a time zone of pg_timezone_names, e.g. Europe/Berlin or UTC.")));
    return timing;
}

long zone_offset(int64_t instant, const void *zone)
{
    pg_time_t t = instant;
    struct pg_tm *local = pg_localtime(&t, static_cast<const pg_tz *>(zone));
    return local != nullptr ? local->tm_gmtoff : 0;
}

int64 unix_seconds_before(TimestampTz at) /* the whole second at or before `at` */
{
    int64 seconds = at / USECS_PER_SEC;
    if (at % USECS_PER_SEC < 0)
        seconds--;
    return seconds + UNIX_EPOCH_IN_PG_SECONDS;
}

/* The first tick after `after`, or false when there is none a timestamp can hold: none after the range of
 * timestamps (infinity), the range's first before it (-infinity). */
bool next_tick(const Timing &timing, TimestampTz after, TimestampTz &tick)
{
    if (after >= END_TIMESTAMP)
        return false;
    after = Max(after, MIN_TIMESTAMP - 1);
    std::optional<int64_t> next =
        gd::cron::next_tick(timing.expression, unix_seconds_before(after), zone_offset, timing.zone);
    if (!next)
        return false;
    int64 seconds = *next - UNIX_EPOCH_IN_PG_SECONDS;
    if (seconds > END_TIMESTAMP / USECS_PER_SEC - 1)
        return false;
    tick = seconds * USECS_PER_SEC;
    return true;
}

} // namespace

/*
 * gd_cron_ticks(cron text, time_zone text, after timestamptz, count int):
 * the next `count` ticks after `after`.
 */
GD_SQL_FUNCTION(gd_cron_ticks)
{
    static const char *const argument_names[4] = {"cron", "time_zone", "after", "count"};
    for (int i = 0; i < 4; i++)
        if (PG_ARGISNULL(i))
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                            errmsg("gen_durable: %s must not be NULL", argument_names[i])));
    Timing timing = check_timing(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1));
    TimestampTz after = PG_GETARG_TIMESTAMPTZ(2);
    int32 count = PG_GETARG_INT32(3);
    if (count < 0 || count > 10000)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("gen_durable: count must be from 0 to 10000, got %d", count)));
    InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
    auto *result = reinterpret_cast<ReturnSetInfo *>(fcinfo->resultinfo);
    for (int i = 0; i < count; i++) {
        CHECK_FOR_INTERRUPTS();
        if (!next_tick(timing, after, after))
            break;
        Datum value = TimestampTzGetDatum(after);
        bool isnull = false;
        tuplestore_putvalues(result->setResult, result->setDesc, &value, &isnull);
    }
    return static_cast<Datum>(0);
}

/* gd._cron_next(cron text, time_zone text, after timestamptz): the first tick after; NULL when none. */
GD_SQL_FUNCTION(gd_cron_next)
{
    Timing timing = check_timing(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1));
    TimestampTz tick;
    if (!next_tick(timing, PG_GETARG_TIMESTAMPTZ(2), tick))
        PG_RETURN_NULL();
    PG_RETURN_TIMESTAMPTZ(tick);
}

/*
 * gd._cron_missed(cron text, time_zone text, first timestamptz, before
 * timestamptz, keep int, OUT kept timestamptz[], OUT total bigint): of the
 * ticks from `first` to before `before`, the last `keep` (oldest first), and
 * how many there are (counted up to MAX_TICKS_COUNTED).
 */
GD_SQL_FUNCTION(gd_cron_missed)
{
    Timing timing = check_timing(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(1));
    TimestampTz at = Max(PG_GETARG_TIMESTAMPTZ(2), MIN_TIMESTAMP) - 1; /* the ticks from `first` on */
    TimestampTz before = PG_GETARG_TIMESTAMPTZ(3);
    int keep = Max(0, PG_GETARG_INT32(4));
    /* The last `keep` ticks, in a ring. */
    Datum *kept = static_cast<Datum *>(palloc(sizeof(Datum) * Max(keep, 1)));
    int64 total = 0;
    while (total < MAX_TICKS_COUNTED && next_tick(timing, at, at) && at < before) {
        CHECK_FOR_INTERRUPTS(); /* 10,000,000 ticks take seconds; no destructor here for its ERROR to skip */
        if (keep > 0)
            kept[total % keep] = TimestampTzGetDatum(at);
        total++;
    }
    int kept_count = static_cast<int>(Min(total, static_cast<int64>(keep)));
    Datum *ordered = static_cast<Datum *>(palloc(sizeof(Datum) * Max(kept_count, 1)));
    for (int i = 0; i < kept_count; i++)
        ordered[i] = kept[(total - kept_count + i) % keep];

    TupleDesc desc;
    if (get_call_result_type(fcinfo, nullptr, &desc) != TYPEFUNC_COMPOSITE)
        elog(ERROR, "gen_durable: gd._cron_missed must return a record");
    desc = BlessTupleDesc(desc);
    Datum values[2] = {PointerGetDatum(construct_array(ordered, kept_count, TIMESTAMPTZOID, sizeof(TimestampTz),
                                                       FLOAT8PASSBYVAL, TYPALIGN_DOUBLE)),
                       Int64GetDatum(total)};
    bool nulls[2] = {false, false};
    PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
