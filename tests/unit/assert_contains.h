/* assert_contains(hay, needle): a cmocka assertion that the string hay
 * holds needle, printing both when not (unit tests; include after
 * <cmocka.h>). */
#ifndef GS_TESTS_ASSERT_CONTAINS_H
#define GS_TESTS_ASSERT_CONTAINS_H

#include <string.h>

#define assert_contains(hay, needle)                                                               \
  do {                                                                                             \
    const char *hay_ = (hay), *needle_ = (needle);                                                 \
    if (!hay_ || !strstr(hay_, needle_)) {                                                         \
      print_error("expected \"%s\" in \"%s\"\n", needle_, hay_ ? hay_ : "(null)");                 \
      fail();                                                                                      \
    }                                                                                              \
  } while (0)

#endif
