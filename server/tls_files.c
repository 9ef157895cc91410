/* The coordinator's TLS files and gRPC's certificate-config fetcher (see
 * tls_files.h). gRPC (ssl_security_connector) asks the fetcher before every
 * server handshake; it answers RELOAD_NEW with a fresh config once after
 * each successful (re)load and RELOAD_UNCHANGED otherwise, so the files are
 * read only at start and on reload, never on the handshake path. The PEM
 * texts that passed the checks are owned by the struct and swapped under
 * its mutex; gRPC copies them into the config it takes ownership of. */
#include "tls_files.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "secret.h"
#include "status.h"

struct gs__tls_files {
  char *cert_path, *key_path, *ca_path; /* ca_path NULL: no client certificates */
  pthread_mutex_t mu;                   /* guards the fields below */
  char *cert, *key, *ca;                /* PEM text that last passed the checks */
  unsigned generation;                  /* bumped by every successful (re)load */
  unsigned handed;                      /* the generation gRPC last got */
};

static void free_key(char *key) {
  if (!key) return;
  memset(key, 0, strlen(key));
  free(key);
}

/* Reads and checks the three files; on success the texts are malloc'd in
 * *cert, *key, *ca (NULL without a CA path). */
static int read_checked(const gs__tls_files *t, char **cert, char **key, char **ca, char *about,
                        size_t aboutlen, char *err, size_t errlen) {
  *cert = *key = *ca = NULL;
  int rc = gs__pem_read(t->cert_path, "--tls-cert", cert, err, errlen);
  if (!rc) rc = gs__pem_read(t->key_path, "--tls-key", key, err, errlen);
  if (!rc && t->ca_path) rc = gs__pem_read(t->ca_path, "--tls-client-ca", ca, err, errlen);
  if (!rc)
    rc = gs__tls_pem_check(*cert, t->cert_path, *key, t->key_path, *ca, t->ca_path, about, aboutlen,
                           err, errlen);
  if (rc) {
    free(*cert);
    free_key(*key);
    free(*ca);
    *cert = *key = *ca = NULL;
  }
  return rc;
}

int gs__tls_files_create(const char *cert, const char *key, const char *ca, gs__tls_files **out,
                         char *about, size_t aboutlen, char *err, size_t errlen) {
  *out = NULL;
  gs__tls_files *t = calloc(1, sizeof *t);
  if (!t) goto out_nomem;
  t->cert_path = strdup(cert);
  t->key_path = strdup(key);
  t->ca_path = ca ? strdup(ca) : NULL;
  if (!t->cert_path || !t->key_path || (ca && !t->ca_path)) goto out_free;
  pthread_mutex_init(&t->mu, NULL);
  int rc = read_checked(t, &t->cert, &t->key, &t->ca, about, aboutlen, err, errlen);
  if (rc) {
    gs__tls_files_destroy(t);
    return rc;
  }
  t->generation = 1;
  *out = t;
  return GS__OK;
out_free:
  free(t->cert_path);
  free(t->key_path);
  free(t->ca_path);
  free(t);
out_nomem:
  snprintf(err, errlen, "out of memory reading the TLS files");
  return GS__ERR_NO_MEMORY;
}

/* gRPC's fetcher, on gRPC's threads: a new config once per (re)load. */
static grpc_ssl_certificate_config_reload_status
fetch(void *arg, grpc_ssl_server_certificate_config **config) {
  gs__tls_files *t = arg;
  grpc_ssl_certificate_config_reload_status st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  pthread_mutex_lock(&t->mu);
  if (t->handed != t->generation) {
    grpc_ssl_pem_key_cert_pair pair = {t->key, t->cert};
    /* gRPC 1.51 asserts that a fetched config has root certificates, even
     * when it requests no client certificates; then they are never used
     * (no CertificateRequest goes out), and the server's own chain serves. */
    *config = grpc_ssl_server_certificate_config_create(t->ca ? t->ca : t->cert, &pair, 1);
    if (*config) {
      t->handed = t->generation;
      st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
    } else {
      st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return st;
}

grpc_server_credentials *gs__tls_files_credentials(gs__tls_files *t) {
  grpc_ssl_server_credentials_options *o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          t->ca_path ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                     : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          fetch, t);
  return o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
}

int gs__tls_files_reload(gs__tls_files *t, char *about, size_t aboutlen, char *err, size_t errlen) {
  char *cert, *key, *ca;
  int rc = read_checked(t, &cert, &key, &ca, about, aboutlen, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&t->mu);
  char *old_cert = t->cert, *old_key = t->key, *old_ca = t->ca;
  t->cert = cert;
  t->key = key;
  t->ca = ca;
  t->generation++;
  pthread_mutex_unlock(&t->mu);
  free(old_cert);
  free_key(old_key);
  free(old_ca);
  return GS__OK;
}

void gs__tls_files_destroy(gs__tls_files *t) {
  if (!t) return;
  pthread_mutex_destroy(&t->mu);
  free(t->cert_path);
  free(t->key_path);
  free(t->ca_path);
  free(t->cert);
  free_key(t->key);
  free(t->ca);
  free(t);
}
