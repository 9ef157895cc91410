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

void gs__log(gs__log_level level, const char *fmt, ...) {
  static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  if (!gs__log_enabled(level)) return;
  char line[8192];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000L, g_program, names[level]);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
