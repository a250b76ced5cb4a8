/*
 * settings.cpp — the gen_durable.* configuration parameters and the parsers
 * for the two list-valued ones.  Every parameter is reloadable (SIGHUP);
 * the list parameters are validated by check hooks, so a bad value is
 * refused at reload instead of reaching the launcher.  gen_durable.now is a
 * session's own: a test's clock for what its claims and drains find due.
 */
#include "gen_durable.hpp"
#include "guard.hpp"
#include "pg_compat.hpp"

extern "C" {
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
}

#include <cctype>
#include <stdexcept>

char *gd_database_setting = nullptr;
char *gd_queues_setting = nullptr;
int gd_lease_ms = 30 * 1000;
int gd_retention_s = 24 * 3600;
int gd_poll_interval_ms = 1000;
int gd_batch_size = 64;
int gd_batch_time_ms = 20;
int gd_chain_limit = 32;
int gd_events = GD_EVENTS_OFF;
int gd_reaper_interval_ms = 1000;
int gd_gc_interval_ms = 60 * 1000;
char *gd_now_setting = nullptr;

namespace gd {
namespace {

std::string trim(const std::string &s)
{
    size_t begin = 0, end = s.size();
    while (begin < end && isspace(static_cast<unsigned char>(s[begin])))
        begin++;
    while (end > begin && isspace(static_cast<unsigned char>(s[end - 1])))
        end--;
    return s.substr(begin, end - begin);
}

std::vector<std::string> split_commas(const char *text)
{
    std::vector<std::string> items;
    std::string current;
    for (const char *p = text ? text : ""; ; p++) {
        if (*p == ',' || *p == '\0') {
            std::string item = trim(current);
            if (!item.empty())
                items.push_back(item);
            else if (*p == ',')
                throw std::invalid_argument("empty entry in list");
            current.clear();
            if (*p == '\0')
                break;
        } else {
            current += *p;
        }
    }
    return items;
}

void check_name(const std::string &name, const char *what)
{
    if (name.empty() || name.size() >= NAMEDATALEN)
        throw std::invalid_argument(std::string(what) + " name \"" + name + "\" is empty or longer than 63 bytes");
    for (char c : name)
        if (isspace(static_cast<unsigned char>(c)) || c == ':' || c == ',')
            throw std::invalid_argument(std::string(what) + " name \"" + name + "\" contains a space, ':' or ','");
}

} // namespace

std::vector<QueueSetting> parse_queue_list(const char *text)
{
    std::vector<QueueSetting> queues;
    for (const std::string &entry : split_commas(text)) {
        QueueSetting queue{entry, 1};
        size_t colon = entry.find(':');
        if (colon != std::string::npos) {
            queue.name = trim(entry.substr(0, colon));
            std::string count = trim(entry.substr(colon + 1));
            size_t used = 0;
            int value = -1;
            try {
                value = std::stoi(count, &used);
            } catch (const std::exception &) {
                used = 0;
            }
            if (used != count.size() || count.empty() || value < 0 || value > GD_MAX_WORKERS)
                throw std::invalid_argument("queue \"" + queue.name + "\" has concurrency \"" + count +
                                            "\"; expected a whole number from 0 to 128");
            queue.concurrency = value;
        }
        check_name(queue.name, "queue");
        for (const QueueSetting &seen : queues)
            if (seen.name == queue.name)
                throw std::invalid_argument("queue \"" + queue.name + "\" is listed twice");
        queues.push_back(queue);
    }
    return queues;
}

std::vector<QueueSetting> queues_of_database(const std::vector<QueueSetting> &queues, const std::string &database,
                                             const std::vector<std::string> &databases)
{
    auto qualifier = [&](const QueueSetting &queue) -> std::string {
        size_t dot = queue.name.find('.');
        if (dot == std::string::npos)
            return "";
        std::string prefix = queue.name.substr(0, dot);
        for (const std::string &served : databases)
            if (served == prefix)
                return prefix;
        return "";
    };
    std::vector<QueueSetting> own;
    for (const QueueSetting &queue : queues) {
        std::string db = qualifier(queue);
        if (!db.empty() && db == database)
            own.push_back(QueueSetting{queue.name.substr(db.size() + 1), queue.concurrency});
    }
    std::vector<QueueSetting> served = own;
    for (const QueueSetting &queue : queues) {
        if (!qualifier(queue).empty())
            continue;
        bool overridden = false;
        for (const QueueSetting &mine : own)
            overridden |= mine.name == queue.name;
        if (!overridden)
            served.push_back(queue);
    }
    return served;
}

std::vector<std::string> parse_database_list(const char *text)
{
    std::vector<std::string> databases = split_commas(text);
    for (const std::string &name : databases)
        check_name(name, "database");
    return databases;
}

} // namespace gd

namespace {

/* Shared body of the list check hooks: parse, and report a failure as GUC detail. */
template <class Parser>
bool check_list(char **newval, Parser parse)
{
    char message[256] = "";
    try {
        parse(*newval);
        return true;
    } catch (const std::exception &e) {
        strlcpy(message, e.what(), sizeof(message));
    }
    GUC_check_errdetail("gen_durable: %s", message);
    return false;
}

bool check_queues(char **newval, void **, GucSource)
{
    return check_list(newval, gd::parse_queue_list);
}

bool check_databases(char **newval, void **, GucSource)
{
    return check_list(newval, gd::parse_database_list);
}

bool check_now(char **newval, void **, GucSource)
{
    TimestampTz ignored;
    if (**newval == '\0' || gd_parse_timestamptz(*newval, &ignored))
        return true;
    GUC_check_errmsg("gen_durable: gen_durable.now must be a timestamp with time zone or empty, got \"%s\"",
                     *newval);
    return false;
}

} // namespace

TimestampTz gd_session_now()
{
    if (gd_now_setting == nullptr || *gd_now_setting == '\0')
        return GetCurrentTimestamp();
    return DatumGetTimestampTz(DirectFunctionCall3(timestamptz_in, CStringGetDatum(gd_now_setting),
                                                   ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1)));
}

void gd_define_settings()
{
    DefineCustomStringVariable("gen_durable.database", "Databases the engine serves, comma-separated.", nullptr,
                               &gd_database_setting, "postgres", PGC_SIGHUP, 0, check_databases, nullptr, nullptr);
    DefineCustomStringVariable("gen_durable.queues", "Queues and their executor counts, as queue:concurrency, comma-separated.",
                               nullptr, &gd_queues_setting, "default:2", PGC_SIGHUP, 0, check_queues, nullptr, nullptr);
    DefineCustomIntVariable("gen_durable.lease", "Default lease of an external worker's claim.", nullptr, &gd_lease_ms,
                            30 * 1000, 100, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("gen_durable.retention", "How long terminal instances are kept before garbage collection.",
                            nullptr, &gd_retention_s, 24 * 3600, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr,
                            nullptr);
    DefineCustomIntVariable("gen_durable.poll_interval", "Fallback poll interval of idle executors.", nullptr,
                            &gd_poll_interval_ms, 1000, 10, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("gen_durable.batch_size", "Maximum steps one executor commits together.", nullptr,
                            &gd_batch_size, 64, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("gen_durable.batch_time",
                            "How long one executor batch should run before it commits: slower steps run fewer per batch.",
                            nullptr, &gd_batch_time_ms, 20, 1, 60 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
                            nullptr);
    DefineCustomIntVariable("gen_durable.chain_limit",
                            "Most steps of one instance an executor runs in one round, one after the other (1: none chained).",
                            nullptr, &gd_chain_limit, 32, 1, 1000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("gen_durable.reaper_interval", "Longest sleep of the reaper between checks.", nullptr,
                            &gd_reaper_interval_ms, 1000, 10, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
                            nullptr);
    DefineCustomIntVariable("gen_durable.gc_interval", "Interval between garbage-collection sweeps.", nullptr,
                            &gd_gc_interval_ms, 60 * 1000, 10, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
                            nullptr);
    static const struct config_enum_entry event_options[] = {
        {"off", GD_EVENTS_OFF, false}, {"transitions", GD_EVENTS_TRANSITIONS, false}, {nullptr, 0, false}};
    DefineCustomEnumVariable("gen_durable.events",
                             "Emit each transition as a logical decoding message (prefix gen_durable).", nullptr,
                             &gd_events, GD_EVENTS_OFF, event_options, PGC_SUSET, 0, nullptr, nullptr, nullptr);
    DefineCustomStringVariable("gen_durable.now",
                               "For tests: the time this session's claims and drains take as now (empty: the clock).",
                               nullptr, &gd_now_setting, "", PGC_USERSET, 0, check_now, nullptr, nullptr);
    MarkGUCPrefixReserved("gen_durable");
}
