/* Reading settings from environment variables, with aliases (Horovod's
 * names) and validation. Messages name the variable, the value and what is
 * accepted. Any thread (getenv only). */
#ifndef GS_COMMON_ENV_H
#define GS_COMMON_ENV_H

#include <stddef.h>
#include <stdint.h>

/* The value of the first variable of names (NULL-terminated) that is set
 * and non-empty; *which receives its name. NULL if none is set. */
const char *gs__env_first(const char *const *names, const char **which);

/* Parses the first set variable of names as an integer in [min, max].
 * Unset: *out = def, GS__OK. Malformed or out of range:
 * GS__ERR_INVALID_ARG with a message. */
int gs__env_int(const char *const *names, int64_t def, int64_t min, int64_t max, int64_t *out,
                char *err, size_t errlen);

/* Parses text as an integer in [min, max]; what names it in messages. */
int gs__parse_int(const char *text, const char *what, int64_t min, int64_t max, int64_t *out,
                  char *err, size_t errlen);

#endif
