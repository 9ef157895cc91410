/* Monotonic time in milliseconds and microseconds. The coordinator's engine
 * never calls these: time reaches it as an argument. Any thread. */
#ifndef GS_COMMON_CLOCK_H
#define GS_COMMON_CLOCK_H
#include <stdint.h>

uint64_t gs__now_ms(void);
/* gs__now_ms at the resolution of the kernel's tick (a few ms; never ahead
 * of gs__now_ms), for stamps compared against thresholds of a second or so
 * on hot paths: about 5x cheaper than a full clock read. */
uint64_t gs__now_ms_coarse(void);
uint64_t gs__now_us(void);
/* Sleeps ms milliseconds (restarting on EINTR). */
void gs__sleep_ms(int ms);

#endif
