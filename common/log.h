/* Logging to stderr: one line per event with a UTC timestamp, the program
 * and the level. The level comes from GRADSYNC_LOG_LEVEL (error, warn,
 * info, debug; default info) or gs__log_set_level. Any thread: each line is
 * written with a single write(2). */
#ifndef GS_COMMON_LOG_H
#define GS_COMMON_LOG_H

typedef enum gs__log_level {
  GS__LOG_ERROR = 0,
  GS__LOG_WARN = 1,
  GS__LOG_INFO = 2,
  GS__LOG_DEBUG = 3
} gs__log_level;

/* Line formats. TEXT: "2026-01-02T03:04:05.678Z prog LEVEL message" (the
 * library's default); LOGFMT: time=... level=info prog=... msg="..."
 * (gradsyncd's default); JSON: one object per line. In LOGFMT and JSON a
 * multi-line message stays one line (newlines escaped). */
typedef enum gs__log_format {
  GS__LOG_TEXT = 0,
  GS__LOG_LOGFMT = 1,
  GS__LOG_JSON = 2
} gs__log_format;
/* Set once at start-up, before threads. */
void gs__log_set_format(gs__log_format f);

/* program: "gradsyncd", "gradsync[rank 3]" ...; copied. */
void gs__log_init(const char *program);
void gs__log_set_level(gs__log_level level);
int gs__log_enabled(gs__log_level level);
void gs__log(gs__log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define GS_LOG_ERROR(...) gs__log(GS__LOG_ERROR, __VA_ARGS__)
#define GS_LOG_WARN(...) gs__log(GS__LOG_WARN, __VA_ARGS__)
#define GS_LOG_INFO(...) gs__log(GS__LOG_INFO, __VA_ARGS__)
#define GS_LOG_DEBUG(...)                                                                          \
  do {                                                                                             \
    if (gs__log_enabled(GS__LOG_DEBUG)) gs__log(GS__LOG_DEBUG, __VA_ARGS__);                       \
  } while (0)

#endif
