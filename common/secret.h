/* Secrets of a job: random bytes, constant-time comparison, HMAC-SHA256,
 * hex, job tokens read from files, and TLS files checked. The one place OpenSSL's crypto
 * library is called; its errors become gradsync statuses here. Pure apart
 * from reading a token file; any thread. */
#ifndef GS_COMMON_SECRET_H
#define GS_COMMON_SECRET_H

#include <stddef.h>
#include <stdint.h>

#define GS__MAX_TOKEN 512 /* bytes of a job token */

/* n cryptographically strong random bytes (OpenSSL RAND_bytes).
 * GS__OK or GS__ERR_INTERNAL. */
int gs__random_bytes(void *buf, size_t n);
/* 1 when the n bytes at a and b are equal; time independent of the data. */
int gs__bytes_equal(const void *a, const void *b, size_t n);
/* 1 when the two tokens are equal; time independent of their contents and
 * of where they differ (both are hashed with SHA-256, then compared). */
int gs__token_equal(const char *a, size_t alen, const char *b, size_t blen);
/* out = HMAC-SHA256(key, msg). */
void gs__hmac_sha256(const void *key, size_t keylen, const void *msg, size_t len, uint8_t out[32]);
/* Lower-case hex of n bytes into out (2n + 1 bytes with the NUL). */
void gs__hex(const uint8_t *b, size_t n, char *out);
/* Parses exactly 2n hex digits into n bytes. 0 on success, -1 otherwise. */
int gs__unhex(const char *s, size_t slen, uint8_t *out, size_t n);
/* Checks a job token: 1..GS__MAX_TOKEN printable ASCII characters without
 * spaces. 0 when valid, else -1 with a reason (never the token) in err. */
int gs__token_check(const char *token, char *err, size_t errlen);
/* Reads a job token from path (the first line; a trailing newline and
 * carriage return are dropped) into out (GS__MAX_TOKEN + 1 bytes) and
 * checks it. GS__OK, or GS__ERR_INVALID_ARG with a message naming the file
 * (never its contents). */
int gs__token_read_file(const char *path, char *out, char *err, size_t errlen);
/* Reads a PEM file (at most 1 MiB) into a NUL-terminated malloc'd string.
 * GS__OK, or GS__ERR_INVALID_ARG with a message naming what (e.g.
 * "GRADSYNC_TLS_CA") and the file. */
int gs__pem_read(const char *path, const char *what, char **out, char *err, size_t errlen);
/* Checks the PEM text of a TLS server certificate chain, its private key
 * and (may be NULL) the client CA bundle with OpenSSL before gRPC gets
 * them: the chain's first certificate parses and has not expired, the key
 * parses (unencrypted) and belongs to that certificate, the CA bundle holds
 * at least one certificate. The *_file names are for the messages only.
 * GS__OK with a one-line description of the certificate (subject, expiry)
 * in about; else GS__ERR_INVALID_ARG with a message in err that names the
 * file at fault and what to do. Any thread. */
int gs__tls_pem_check(const char *cert_pem, const char *cert_file, const char *key_pem,
                      const char *key_file, const char *ca_pem, const char *ca_file, char *about,
                      size_t aboutlen, char *err, size_t errlen);
/* A fresh random token (64 hex digits) into out (65 bytes). */
int gs__token_generate(char out[65]);

#endif
