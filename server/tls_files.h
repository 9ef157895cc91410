/* The coordinator's TLS files (--tls-cert, --tls-key, --tls-client-ca):
 * read and checked (secret.h) at start and again on every reload, and
 * served to gRPC through its certificate-config fetcher, which gRPC calls
 * for every new connection's handshake. A reload whose files fail the
 * checks changes nothing: new connections keep getting the files that
 * last passed. Connections already open keep the certificate they were
 * set up with.
 *
 * Threads: create, reload and destroy from one thread (gradsyncd's queue
 * thread); the fetcher runs on gRPC's threads and only takes the lock
 * that reload takes to swap in new text. */
#ifndef GS_SERVER_TLS_FILES_H
#define GS_SERVER_TLS_FILES_H

#include <stddef.h>

#include <grpc/grpc_security.h>

typedef struct gs__tls_files gs__tls_files;

/* Reads and checks the files (ca may be NULL: no client certificates;
 * otherwise they are required and verified, mTLS). The paths are copied.
 * GS__OK with *out and a description of the certificate in about, or an
 * error naming the file at fault in err. */
int gs__tls_files_create(const char *cert, const char *key, const char *ca, gs__tls_files **out,
                         char *about, size_t aboutlen, char *err, size_t errlen);
/* New server credentials that fetch the current files on every handshake
 * (the caller releases them; t must outlive the grpc_server they are
 * added to). NULL if gRPC refused. */
grpc_server_credentials *gs__tls_files_credentials(gs__tls_files *t);
/* Reads the same paths again. GS__OK: new connections get the new files
 * (about describes the certificate); otherwise nothing changed and err
 * says which file is at fault and what to do. Blocks for the reads of
 * three small local files. */
int gs__tls_files_reload(gs__tls_files *t, char *about, size_t aboutlen, char *err, size_t errlen);
/* Frees t; after the server that used its credentials is destroyed.
 * NULL is a no-op. */
void gs__tls_files_destroy(gs__tls_files *t);

#endif
