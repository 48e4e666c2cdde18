// A build without libcurl: the Hugging Face cache is read, the Hub is never asked.
#include "hub_internal.h"

bool llama_hub_has_http(void) { return false; }

int hub_http_get(const llama_hub *h, hub_get *g, ag_err *err) {
    (void)h;
    g->unreachable = true;
    ag_err_set(err,
               "%s is not in the cache, and this membill was built without libcurl: it reads the Hugging Face "
               "cache alone (rebuild with libcurl4-openssl-dev installed to reach the Hub)",
               g->file);
    return -1;
}
