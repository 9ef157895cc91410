/* Monotonic time in milliseconds and microseconds. The coordinator's engine
 * never calls these: time reaches it as an argument. Any thread. */
#ifndef GS_COMMON_CLOCK_H
#define GS_COMMON_CLOCK_H
#include <stdint.h>

uint64_t gs__now_ms(void);
uint64_t gs__now_us(void);
/* Sleeps ms milliseconds (restarting on EINTR). */
void gs__sleep_ms(int ms);

#endif
