/* Secrets of a job (see secret.h): OpenSSL's RAND, CRYPTO_memcmp, SHA-256,
 * HMAC and PEM/X.509 parsing behind gradsync's own names. */
#include "secret.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

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

/* OpenSSL's reason for the last failure on this thread (and its queue
 * emptied), or "no details". */
static const char *openssl_reason(char *buf, size_t len) {
  unsigned long e = ERR_peek_last_error();
  if (e)
    ERR_error_string_n(e, buf, len);
  else
    snprintf(buf, len, "no details");
  ERR_clear_error();
  return buf;
}

/* Never prompts for a passphrase (gRPC cannot use an encrypted key). */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
  (void)buf, (void)size, (void)rwflag, (void)u;
  return -1;
}

/* ASN1_TIME as "2027-01-31 12:00:00 UTC" into out. */
static void asn1_time_text(const ASN1_TIME *t, char *out, size_t len) {
  struct tm tm;
  if (t && ASN1_TIME_to_tm(t, &tm) == 1)
    strftime(out, len, "%Y-%m-%d %H:%M:%S UTC", &tm);
  else
    snprintf(out, len, "(unknown)");
}

int gs__tls_pem_check(const char *cert_pem, const char *cert_file, const char *key_pem,
                      const char *key_file, const char *ca_pem, const char *ca_file, char *about,
                      size_t aboutlen, char *err, size_t errlen) {
  char why[256], subject[256], expires[64];
  int rc = GS__ERR_INVALID_ARG;
  X509 *leaf = NULL, *ca = NULL;
  EVP_PKEY *key = NULL;
  ERR_clear_error();
  BIO *b = BIO_new_mem_buf(cert_pem, -1);
  if (b) leaf = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
  BIO_free(b);
  if (!leaf) {
    snprintf(err, errlen,
             "--tls-cert %s holds no readable certificate (OpenSSL: %s); it must start with the "
             "server's PEM certificate (-----BEGIN CERTIFICATE-----), then any intermediates",
             cert_file, openssl_reason(why, sizeof why));
    goto out;
  }
  X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof subject);
  asn1_time_text(X509_get0_notAfter(leaf), expires, sizeof expires);
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) <= 0) {
    snprintf(err, errlen,
             "--tls-cert %s: the certificate %s expired on %s; put a current certificate (and "
             "its key) in place",
             cert_file, subject, expires);
    goto out;
  }
  b = BIO_new_mem_buf(key_pem, -1);
  if (b) key = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
  BIO_free(b);
  if (!key) {
    snprintf(err, errlen,
             "--tls-key %s holds no readable private key (OpenSSL: %s); it must be an "
             "unencrypted PEM key (openssl pkey -in KEY -out KEY.plain removes a passphrase)",
             key_file, openssl_reason(why, sizeof why));
    goto out;
  }
  if (X509_check_private_key(leaf, key) != 1) {
    ERR_clear_error();
    snprintf(err, errlen,
             "--tls-key %s does not belong to the certificate in --tls-cert %s (%s): put the key "
             "that was issued with this certificate in place",
             key_file, cert_file, subject);
    goto out;
  }
  if (ca_pem) {
    b = BIO_new_mem_buf(ca_pem, -1);
    if (b) ca = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    if (!ca) {
      snprintf(err, errlen,
               "--tls-client-ca %s holds no readable CA certificate (OpenSSL: %s); it must hold "
               "the PEM certificates of the CAs that sign the ranks' client certificates",
               ca_file, openssl_reason(why, sizeof why));
      goto out;
    }
  }
  snprintf(about, aboutlen, "certificate %s, expires %s", subject, expires);
  rc = GS__OK;
out:
  X509_free(leaf);
  X509_free(ca);
  EVP_PKEY_free(key);
  ERR_clear_error();
  return rc;
}
