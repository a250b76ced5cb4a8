/*
 * crashed_steps.cpp — the attempt of a step that ends its executor.
 *
 * A step that kills its executor (a segfault, an out-of-memory kill, a
 * handler ending its own backend, one that ignores the cancel of its
 * timeout) takes its round down with it, so without more its instance is
 * picked again, and does it again: a crash loop.  So an executor notes the
 * step in flight before each handler call — database, instance, and the
 * row's updated_at (the version the step started from) — in a small file of
 * its worker slot, mapped into memory (a store per call, no system call),
 * and clears the note when the handler returns.  The note outlives the
 * process and the postmaster's reinitialisation of shared memory after a
 * crash.
 *
 * Ends that are not the step's doing clear it: a SIGQUIT (an immediate
 * shutdown, or another process's crash), a SIGTERM from another process (a
 * shutdown, the launcher), the postmaster's death.  A step that terminates
 * its own backend, or overruns its timeout and the grace after it (the
 * watchdog ends the backend), leaves the note with its cause; a crash leaves
 * it as it was.
 *
 * A note whose writer is no longer an engine worker is a step that ended
 * its executor: the workers of its database count it as a failed attempt
 * (error kind "crashed", or "timeout"; past max_attempts the instance
 * fails) when they start and, in the reaper, after the launcher saw a worker
 * die — if the row is still the version the step started from, so a note
 * counted twice, or one left by a backup, changes nothing.  A row a round
 * holds is running again (it was picked before the count): its note is
 * counted later, and each further crash leaves a note of its own.  A step of
 * a chain (run after the step picked, in the same round) that ends its
 * executor rolls the whole round back: its attempt is counted against the
 * step picked, the row's, its error naming the step that ran; that retry runs
 * its step alone (a retry does not chain), so a step that crashes again is
 * counted as itself.
 */
#include "crashed_steps.hpp"
#include "error_documents.hpp"
#include "gen_durable.hpp"
#include "kept_plans.hpp"
#include "picker.hpp"
#include "stats.hpp"
#include "step_definitions.hpp"
#include "transition.hpp"

extern "C" {
#include "access/xact.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/timeout.h"
}

#include <csignal>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

constexpr const char *NOTES_DIRECTORY = "gen_durable";
constexpr uint32 NOTE_MAGIC = 0x67645332; /* "gdS2" */

/* Why the writer of a note ended. */
enum class Cause : int32 {
    none = 0,          /* not known: a crash, if the writer is gone */
    interrupted,       /* not the step's doing: the note is cleared at exit */
    terminated_itself, /* the step sent its own backend SIGTERM */
    overran,           /* the step ran past its timeout and the grace after it */
};

/* One worker slot's note, as laid out in its file. */
struct StepNote {
    uint32 magic;
    pid_t writer;
    Oid database;
    pg_atomic_uint32 cause;     /* a Cause */
    TimestampTz version;        /* the instance's updated_at when picked */
    int32 timeout_ms;           /* the step's timeout, for the message */
    char step[NAMEDATALEN];     /* the step running: the row's, or one after it in a chain */
    pg_atomic_uint64 instance;  /* 0: no step in flight */
};

StepNote *my_note = nullptr; /* this executor's, mapped */
TimeoutId watchdog = MAX_TIMEOUTS;
constexpr int WATCHDOG_GRACE_MS = 1000;

/* A note's file: gen_durable/<database oid>.<slot>, so a slot planned for another database after a restart
 * leaves the old note to the workers of its own. */
void note_path(char *path, size_t size, Oid database, int slot_index)
{
    snprintf(path, size, "%s/%u.%d", NOTES_DIRECTORY, database, slot_index);
}

/* The note in a file (made at its full size with O_CREAT); nullptr when there is none, or none yet. */
StepNote *map_note(const char *path, int flags)
{
    int fd = open(path, flags, S_IRUSR | S_IWUSR);
    if (fd < 0)
        return nullptr;
    struct stat size {};
    bool whole = (flags & O_CREAT) ? ftruncate(fd, sizeof(StepNote)) == 0
                                   : fstat(fd, &size) == 0 && size.st_size >= static_cast<off_t>(sizeof(StepNote));
    void *mapped = whole ? mmap(nullptr, sizeof(StepNote), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    return mapped == MAP_FAILED ? nullptr : static_cast<StepNote *>(mapped);
}

/* Not the step's doing: forget it (the handlers below run in signal context: plain stores only). */
void clear_note()
{
    if (my_note != nullptr)
        pg_atomic_write_u64(&my_note->instance, 0);
}

void on_quit(SIGNAL_ARGS)
{
    clear_note(); /* an immediate shutdown, or another process crashed: this step is innocent */
    SignalHandlerForCrashExit(postgres_signal_arg);
}

void on_terminate(int signo, siginfo_t *info, void *)
{
    if (my_note != nullptr) {
        uint32 expected = static_cast<uint32>(Cause::none);
        Cause cause = info != nullptr && info->si_pid == MyProcPid ? Cause::terminated_itself : Cause::interrupted;
        pg_atomic_compare_exchange_u32(&my_note->cause, &expected, static_cast<uint32>(cause));
    }
    die(signo);
}

void on_watchdog()
{
    if (my_note != nullptr) {
        uint32 expected = static_cast<uint32>(Cause::none);
        pg_atomic_compare_exchange_u32(&my_note->cause, &expected, static_cast<uint32>(Cause::overran));
    }
    die(SIGTERM);
}

void at_exit(int, Datum)
{
    if (my_note == nullptr)
        return;
    Cause cause = static_cast<Cause>(pg_atomic_read_u32(&my_note->cause));
    if (cause == Cause::interrupted || !PostmasterIsAlive())
        clear_note();
}

/* Is `pid` an engine worker now running? */
bool writer_alive(pid_t pid)
{
    bool alive = false;
    LWLockAcquire(gd_shared->lock, LW_SHARED);
    for (const WorkerSlot &slot : gd_shared->workers)
        if (slot.kind != WorkerKind::free && slot.pid == pid)
            alive = true;
    LWLockRelease(gd_shared->lock);
    return alive;
}

const char *cause_message(Cause cause, const PickedInstance &row, const char *step, int timeout_ms)
{
    const char *chained = strcmp(step, row.step) == 0
                              ? ""
                              : psprintf(" (run after step \"%s\" in the same round)", row.step);
    switch (cause) {
    case Cause::terminated_itself:
        return psprintf("gen_durable: step \"%s\"%s ended its own executor", step, chained);
    case Cause::overran:
        return psprintf("gen_durable: step \"%s\"%s ran past its timeout of %d ms and did not stop when cancelled; "
                        "its executor was ended", step, chained, timeout_ms);
    default:
        return psprintf("gen_durable: the executor running step \"%s\"%s died (a crash or a kill)", step, chained);
    }
}

Datum crash_error(Cause cause, const PickedInstance &row, const char *step, int timeout_ms)
{
    return gd_error_document(row, ErrorFields{cause == Cause::overran ? "timeout" : "crashed",
                                              cause_message(cause, row, step, timeout_ms)});
}

/* What became of a note's step. */
enum class Counted { attempt, moved_on, running };

/* Count the attempt of the step a note names, if its row is still the version the step started from.
 * A row locked by a round is running again: the note waits for a later count (or goes stale). */
Counted count_attempt(int64 instance, TimestampTz version, const char *step, Cause cause, int timeout_ms)
{
    static SPIPlanPtr crashed_plan = nullptr;
    static SPIPlanPtr locked_plan = nullptr;
    if (crashed_plan == nullptr) {
        Oid types[2] = {INT8OID, TIMESTAMPTZOID};
        crashed_plan = gd_prepare_kept("SELECT " GD_INSTANCE_COLUMNS ", i.queue FROM gd._instances i"
                                       " WHERE i.id = $1 AND i.updated_at = $2 AND i.status = " GD_STATUS(runnable) " AND NOT i.external"
                                       " FOR UPDATE SKIP LOCKED",
                                       2, types);
        locked_plan = gd_prepare_kept("SELECT FROM gd._instances i"
                                      " WHERE i.id = $1 AND i.updated_at = $2 AND i.status = " GD_STATUS(runnable) " AND NOT i.external",
                                      2, types);
    }
    Datum args[2] = {Int64GetDatum(instance), TimestampTzGetDatum(version)};
    if (gd_execute_kept(crashed_plan, args, nullptr, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "gen_durable: looking up crashed instance " INT64_FORMAT " failed", instance);
    if (SPI_processed == 0) {
        if (gd_execute_kept(locked_plan, args, nullptr, true, 1) != SPI_OK_SELECT)
            elog(ERROR, "gen_durable: looking up crashed instance " INT64_FORMAT " failed", instance);
        return SPI_processed == 0 ? Counted::moved_on : Counted::running;
    }
    PickedInstance row{};
    gd_read_instance(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, row);
    row.queue = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, GD_INSTANCE_COLUMN_COUNT + 1);
    std::optional<StepDefinition> def = gd_find_step(row.fsm, row.version, row.step);
    if (!def)
        return Counted::moved_on; /* the executors fail it when they pick it */
    Transition t = gd_retry_transition(row, *def, crash_error(cause, row, step, timeout_ms), -1);
    gd_apply_transition(row.id, t, StatusWriter::crash);
    ereport(LOG, (errmsg("gen_durable: counted an attempt of instance " INT64_FORMAT ": %s", row.id,
                         cause_message(cause, row, step, timeout_ms))));
    return Counted::attempt;
}

} // namespace

void gd_install_step_note_handlers()
{
    struct sigaction terminate{};
    terminate.sa_sigaction = on_terminate;
    terminate.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&terminate.sa_mask);
    sigaction(SIGTERM, &terminate, nullptr);
    pqsignal(SIGQUIT, on_quit);
    before_shmem_exit(at_exit, 0);
    watchdog = RegisterTimeout(USER_TIMEOUT, on_watchdog);
}

void gd_open_step_note(int slot_index)
{
    if (my_note != nullptr)
        return;
    if (mkdir(NOTES_DIRECTORY, S_IRWXU) != 0 && errno != EEXIST)
        ereport(ERROR, (errcode_for_file_access(), errmsg("gen_durable: could not create directory \"%s\": %m",
                                                          NOTES_DIRECTORY)));
    char path[MAXPGPATH];
    note_path(path, sizeof(path), MyDatabaseId, slot_index);
    my_note = map_note(path, O_RDWR | O_CREAT);
    if (my_note == nullptr)
        ereport(ERROR, (errcode_for_file_access(), errmsg("gen_durable: could not map \"%s\": %m", path)));
}

void gd_note_step(const PickedInstance &row, int timeout_ms)
{
    if (my_note == nullptr)
        return;
    my_note->writer = MyProcPid;
    my_note->database = MyDatabaseId;
    my_note->version = row.updated_at;
    my_note->timeout_ms = timeout_ms;
    strlcpy(my_note->step, row.step, sizeof(my_note->step));
    pg_atomic_write_u32(&my_note->cause, static_cast<uint32>(Cause::none));
    my_note->magic = NOTE_MAGIC;
    pg_write_barrier();
    pg_atomic_write_u64(&my_note->instance, static_cast<uint64>(row.id));
    if (timeout_ms > 0)
        enable_timeout_after(watchdog, timeout_ms + WATCHDOG_GRACE_MS);
}

void gd_note_step_ended()
{
    if (my_note == nullptr)
        return;
    disable_timeout(watchdog, false);
    clear_note();
}

bool gd_count_crashed_steps()
{
    DIR *directory = AllocateDir(NOTES_DIRECTORY);
    if (directory == nullptr)
        return false; /* no executor has noted a step yet */
    bool left = false;
    char prefix[16];
    snprintf(prefix, sizeof(prefix), "%u.", MyDatabaseId);
    struct dirent *entry;
    while ((entry = ReadDir(directory, NOTES_DIRECTORY)) != nullptr) {
        if (strncmp(entry->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char path[MAXPGPATH];
        snprintf(path, sizeof(path), "%s/%s", NOTES_DIRECTORY, entry->d_name);
        StepNote *note = map_note(path, O_RDWR);
        if (note == nullptr)
            continue;
        uint64 instance = pg_atomic_read_u64(&note->instance);
        if (note->magic == NOTE_MAGIC && instance != 0 && !writer_alive(note->writer)) {
            char step[NAMEDATALEN];
            strlcpy(step, note->step, sizeof(step));
            Counted counted = count_attempt(static_cast<int64>(instance), note->version, step,
                                            static_cast<Cause>(pg_atomic_read_u32(&note->cause)), note->timeout_ms);
            if (counted == Counted::running)
                left = true;
            else
                pg_atomic_compare_exchange_u64(&note->instance, &instance, 0);
        }
        munmap(note, sizeof(StepNote));
    }
    FreeDir(directory);
    return left;
}
