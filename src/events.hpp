/*
 * events.hpp — the transactional event stream (events.cpp): what the
 * engine writes of an instance's changes into the WAL, for logical decoding.
 */
#pragma once

#include "transition.hpp"

struct InstanceEvent {
    int64 id;
    const char *fsm;
    int version;
    const char *step;      /* the step that ran, or the instance was at (nullptr: none, an insert) */
    const char *from;      /* the status before (nullptr: none) */
    const char *to;        /* the status after */
    const char *next_step; /* the step after */
    const char *kind;
    int attempt;
};
/* Write an event into the WAL as a transactional logical decoding message. */
void gd_emit_event(const InstanceEvent &event);
/* The event of a written step transition. */
void gd_emit_transition_event(int64 id, const Transition &t);
/* Before the engine changes an instance itself: what the event will say of
 * it before (read only when gen_durable.events is on); after the change,
 * gd_emit_event_after reads the rest and emits it. */
InstanceEvent gd_event_before(int64 id, const char *kind);
void gd_emit_event_after(InstanceEvent event);
