/* Secrets of a job (see secret.h): OpenSSL's RAND, CRYPTO_memcmp, SHA-256
 * and HMAC behind gradsync's own names. */
#include "secret.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "status.h"

int gs__random_bytes(void *buf, size_t n) {
  if (n > (size_t)1 << 30) return GS__ERR_INVALID_ARG;
  return RAND_bytes(buf, (int)n) == 1 ? GS__OK : GS__ERR_INTERNAL;
}

int gs__bytes_equal(const void *a, const void *b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

int gs__token_equal(const char *a, size_t alen, const char *b, size_t blen) {
  uint8_t ha[SHA256_DIGEST_LENGTH], hb[SHA256_DIGEST_LENGTH];
  SHA256((const unsigned char *)a, alen, ha);
  SHA256((const unsigned char *)b, blen, hb);
  return CRYPTO_memcmp(ha, hb, sizeof ha) == 0;
}

void gs__hmac_sha256(const void *key, size_t keylen, const void *msg, size_t len, uint8_t out[32]) {
  unsigned int olen = 32;
  if (!HMAC(EVP_sha256(), key, (int)keylen, msg, len, out, &olen)) memset(out, 0, 32);
}

void gs__hex(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = 0;
}

static int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int gs__unhex(const char *s, size_t slen, uint8_t *out, size_t n) {
  if (slen != 2 * n) return -1;
  for (size_t i = 0; i < n; i++) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

int gs__token_check(const char *token, char *err, size_t errlen) {
  size_t n = strlen(token);
  if (n == 0 || n > GS__MAX_TOKEN) {
    snprintf(err, errlen, "the job token is %s (expected 1 to %d characters)",
             n ? "too long" : "empty", GS__MAX_TOKEN);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)token[i];
    if (c <= ' ' || c >= 127) {
      snprintf(err, errlen,
               "the job token contains a space or a control or non-ASCII character at "
               "position %zu (expected printable ASCII only)",
               i + 1);
      return -1;
    }
  }
  return 0;
}

int gs__token_read_file(const char *path, char *out, char *err, size_t errlen) {
  out[0] = 0;
  FILE *f = fopen(path, "re");
  if (!f) {
    snprintf(err, errlen, "cannot read the token file %s: %s", path, strerror(errno));
    return GS__ERR_INVALID_ARG;
  }
  char buf[GS__MAX_TOKEN + 3];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *nl = strchr(buf, '\n');
  if (nl) *nl = 0;
  n = strlen(buf);
  if (n && buf[n - 1] == '\r') buf[--n] = 0;
  char why[256];
  if (n > GS__MAX_TOKEN || gs__token_check(buf, why, sizeof why) != 0) {
    snprintf(err, errlen, "the token file %s: %s", path,
             n > GS__MAX_TOKEN ? "its first line is longer than 512 characters" : why);
    OPENSSL_cleanse(buf, sizeof buf);
    return GS__ERR_INVALID_ARG;
  }
  memcpy(out, buf, n + 1);
  OPENSSL_cleanse(buf, sizeof buf);
  return GS__OK;
}

int gs__pem_read(const char *path, const char *what, char **out, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "re");
  if (!f) {
    snprintf(err, errlen, "%s: cannot read %s: %s", what, path, strerror(errno));
    return GS__ERR_INVALID_ARG;
  }
  size_t cap = (size_t)1 << 20;
  char *buf = malloc(cap + 1);
  if (!buf) {
    fclose(f);
    snprintf(err, errlen, "%s: out of memory reading %s", what, path);
    return GS__ERR_NO_MEMORY;
  }
  size_t n = fread(buf, 1, cap + 1, f);
  fclose(f);
  buf[n > cap ? cap : n] = 0;
  if (n > cap || n == 0 || !strstr(buf, "-----BEGIN ")) {
    snprintf(err, errlen, "%s: %s is %s", what, path,
             n > cap ? "larger than 1 MiB" : "not a PEM file (no -----BEGIN line)");
    OPENSSL_cleanse(buf, n > cap ? cap : n);
    free(buf);
    return GS__ERR_INVALID_ARG;
  }
  *out = buf;
  return GS__OK;
}

int gs__token_generate(char out[65]) {
  uint8_t b[32];
  if (gs__random_bytes(b, sizeof b) != GS__OK) return GS__ERR_INTERNAL;
  gs__hex(b, sizeof b, out);
  OPENSSL_cleanse(b, sizeof b);
  return GS__OK;
}
