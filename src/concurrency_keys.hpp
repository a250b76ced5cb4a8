/*
 * concurrency_keys.hpp — room under concurrency keys (concurrency_keys.cpp):
 * when a key's holder stops running, the best instances waiting under it
 * are admitted, keys taken in one order so two rounds never deadlock.
 */
#pragma once

extern "C" {
#include "postgres.h"
}

/* The instance of `owner` holding `key` stopped running in this transaction: make room at the next release. */
void gd_remember_key_to_release(Oid owner, const char *key);
/* Make room under the keys remembered in this transaction.  Runners call it once, after their last transition. */
void gd_release_concurrency_keys();
