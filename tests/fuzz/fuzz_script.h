/* The script format of fuzz_engine's inputs, shared with fuzz_seeds (which
 * writes valid scripts as the seed corpus):
 *   byte 0: world size 1 + b % FZ_MAX_WORLD; bit 7: world size taken from
 *           the first joiner; bit 4: deadlock action warn; bit 6: the fast
 *           path on (FZ_CONNECT_ALL's hellos then say the ranks run fast
 *           rounds; a hello in an FZ_MESSAGE says what its bytes say)
 *   byte 1: engine settings (fusion threshold, cache capacity, stall
 *           shutdown, rank timeout, emission policy, plans in flight,
 *           pending limit 4), one bit or two each
 *   then events of two bytes, OP and R: rank = R % (FZ_MAX_WORLD + 1),
 *   minus 1 when bit 7 of R is set (so -1 and out-of-range ranks occur);
 *   FZ_MESSAGE is followed by a 16-bit little-endian length and that many
 *   bytes of an encoded gradsync.v1.RankMessage. */
#ifndef GS_FUZZ_SCRIPT_H
#define GS_FUZZ_SCRIPT_H

#define FZ_MAX_WORLD 4

enum {
  FZ_JOIN = 0,        /* R's bit 6: with a wrong size */
  FZ_OPEN = 1,        /* session hello of the rank */
  FZ_MESSAGE = 2,     /* a Session message from the rank */
  FZ_CLOSE = 3,       /* its session ends (bit 0 of R: with a detail) */
  FZ_TICK = 4,        /* the clock advances R x 50 ms, then tick */
  FZ_CONNECT_ALL = 5, /* every rank joins and opens its session */
  FZ_TIMELINE = 6,    /* bit 0 of R: a timeline starts (1) or stops (0);
                         bit 1: the coordinator starts draining */
  FZ_OP_COUNT
};

#endif
