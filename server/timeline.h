/* The coordinator's timeline: a Chrome trace-event JSON file (Perfetto,
 * chrome://tracing) with one row per tensor: each rank's submission, the
 * negotiation wait (first submission to the plan), the plan it went into,
 * and the plan's execution until every rank reported it done. Written by
 * the completion-queue thread as events happen; the file is valid JSON
 * once stopped (StopTimeline, SIGTERM, the job's end), even mid-step: open
 * spans are closed at the stop time. */
#ifndef GS_SERVER_TIMELINE_H
#define GS_SERVER_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "messages.h"

typedef struct gs__timeline gs__timeline;

/* Creates path (truncating) and writes the header. GS__OK or an error with
 * a message in err. */
int gs__timeline_start(const char *path, gs__timeline **out, char *err, size_t errlen);
const char *gs__timeline_path(const gs__timeline *t);
/* rank submitted name (op) at now_us. */
void gs__timeline_submit(gs__timeline *t, const char *name, gs__op_type op, int32_t rank,
                         uint64_t now_us);
/* A plan went out to every rank. */
void gs__timeline_plan(gs__timeline *t, const gs__plan *plan, uint64_t now_us);
/* rank reported plan seq executed. The plan's spans end once `connected`
 * ranks (those still connected) reported it; it is forgotten once `world`
 * ranks (the world size) did, or said at the stop. */
void gs__timeline_done(gs__timeline *t, uint64_t seq, int32_t rank, int32_t connected,
                       int32_t world, uint64_t now_us);
/* Closes open spans, ends the JSON array, closes the file and frees t.
 * A plan some rank of the world (ranks 0..world-1) has not reported done
 * gets an instant "done not reported by ranks [..]" on its rows, and a
 * warning in the log names them. Returns the number of events written.
 * NULL is a no-op (0). */
uint64_t gs__timeline_stop(gs__timeline *t, int32_t world, uint64_t now_us);

#endif
