// Private to model/: file helpers that the config, safetensors and checkpoint readers share.
#pragma once

#include "model.h"

// The whole of a small regular file (opened with llama_open_regular) into *out (malloc'd, one
// byte more than *len, for a terminator); what names the kind of file in the message when it is
// larger than max bytes ("a config.json").
int llama_read_small_file(const char *path, const char *what, uint64_t max, char **out, size_t *len, ag_err *err);

// "[2, 3]" into buf (len bytes).
void llama_format_shape(char *buf, size_t len, const int64_t *shape, int ndim);
