/* Environment and flag value parsing. */
#include "env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "status.h"

const char *gs__env_first(const char *const *names, const char **which) {
  for (size_t i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) {
      if (which) *which = names[i];
      return v;
    }
  }
  return NULL;
}

int gs__parse_int(const char *text, const char *what, int64_t min, int64_t max, int64_t *out,
                  char *err, size_t errlen) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || end == text || *end != 0 || v < min || v > max) {
    snprintf(err, errlen, "%s='%s' is not valid: expected an integer from %lld to %lld", what, text,
             (long long)min, (long long)max);
    return GS__ERR_INVALID_ARG;
  }
  *out = v;
  return GS__OK;
}

int gs__env_int(const char *const *names, int64_t def, int64_t min, int64_t max, int64_t *out,
                char *err, size_t errlen) {
  const char *which = NULL;
  const char *v = gs__env_first(names, &which);
  if (!v) {
    *out = def;
    return GS__OK;
  }
  return gs__parse_int(v, which, min, max, out, err, errlen);
}
