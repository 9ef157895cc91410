/* stderr logger. The level and program name are set once at start-up
 * (before threads start) and only read afterwards. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static char g_program[64] = "gradsync";
static int g_level = -1;
static int g_format = GS__LOG_TEXT;

static int level_from_env(void) {
  const char *v = getenv("GRADSYNC_LOG_LEVEL");
  if (!v || !*v) return GS__LOG_INFO;
  if (!strcasecmp(v, "error")) return GS__LOG_ERROR;
  if (!strcasecmp(v, "warn") || !strcasecmp(v, "warning")) return GS__LOG_WARN;
  if (!strcasecmp(v, "debug")) return GS__LOG_DEBUG;
  return GS__LOG_INFO;
}

void gs__log_init(const char *program) {
  snprintf(g_program, sizeof g_program, "%s", program);
  if (g_level < 0) g_level = level_from_env();
}

void gs__log_set_level(gs__log_level level) {
  g_level = (int)level;
}

int gs__log_enabled(gs__log_level level) {
  if (g_level < 0) g_level = level_from_env();
  return (int)level <= g_level;
}

void gs__log_set_format(gs__log_format f) {
  g_format = (int)f;
}

/* Appends src to out (cap) as the inside of a JSON / logfmt string:
 * quotes, backslashes and control characters escaped. */
static size_t escape(char *out, size_t n, size_t cap, const char *src) {
  for (const unsigned char *p = (const unsigned char *)src; *p && n + 8 < cap; p++) {
    if (*p == '"' || *p == '\\') {
      out[n++] = '\\';
      out[n++] = (char)*p;
    } else if (*p == '\n') {
      out[n++] = '\\';
      out[n++] = 'n';
    } else if (*p == '\t') {
      out[n++] = '\\';
      out[n++] = 't';
    } else if (*p < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", *p);
    } else {
      out[n++] = (char)*p;
    }
  }
  return n;
}

void gs__log(gs__log_level level, const char *fmt, ...) {
  static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  if (!gs__log_enabled(level)) return;
  static const char *const lower[] = {"error", "warn", "info", "debug"};
  char msg[8192], line[16384], stamp[40];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(stamp, sizeof stamp, "%s.%03dZ", day, (int)(ts.tv_nsec / 1000000L));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t n;
  if (g_format == GS__LOG_LOGFMT) {
    n = (size_t)snprintf(line, sizeof line, "time=%s level=%s prog=\"", stamp, lower[level]);
    n = escape(line, n, sizeof line, g_program);
    n += (size_t)snprintf(line + n, sizeof line - n, "\" msg=\"");
    n = escape(line, n, sizeof line, msg);
    line[n++] = '"';
  } else if (g_format == GS__LOG_JSON) {
    n = (size_t)snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"prog\":\"", stamp,
                         lower[level]);
    n = escape(line, n, sizeof line, g_program);
    n += (size_t)snprintf(line + n, sizeof line - n, "\",\"msg\":\"");
    n = escape(line, n, sizeof line, msg);
    line[n++] = '"';
    line[n++] = '}';
  } else {
    n = (size_t)snprintf(line, sizeof line, "%s %s %s %s", stamp, g_program, names[level], msg);
    if (n > sizeof line - 2) n = sizeof line - 2;
  }
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
