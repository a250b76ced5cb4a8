/*
 * module.cpp — the library's entry point: settings, shared memory, the
 * commit-time wake-up callback, the utility hook and the launcher, registered when the
 * library is loaded by shared_preload_libraries.
 */
#include "gen_durable.hpp"

extern "C" {
#include "fmgr.h"
#include "miscadmin.h"

PG_MODULE_MAGIC;

PGDLLEXPORT void _PG_init(void);
}

void _PG_init(void)
{
    gd_define_settings();
    gd_register_xact_callback();
    gd_register_await_cleanup();
    gd_install_utility_hook();
    if (!process_shared_preload_libraries_in_progress)
        return; /* loaded on demand: SQL functions work, but no engine runs */
    gd_install_shmem_hooks();
    /* pg_upgrade's servers (-b) run nothing of the engine: it would connect to
     * the databases pg_upgrade drops and makes again. */
    if (!IsBinaryUpgrade)
        gd_register_launcher();
}
