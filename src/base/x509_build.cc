#include "base/x509_build.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "base/error.h"

namespace openshell::x509 {

void fail(const std::string& what) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  char text[256] = "unknown error";
  if (code) ERR_error_string_n(code, text, sizeof text);
  throw Error(what + ": " + text);
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) fail(std::string("make the extension ") + OBJ_nid2sn(nid) + " = " + value);
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) fail(std::string("add the extension ") + OBJ_nid2sn(nid));
}

void add_name_entry(X509_NAME* name, const char* field, const std::string& value) {
  if (X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1,
                                 0) != 1)
    fail(std::string("set the subject's ") + field + " to '" + value + "'");
}

}  // namespace openshell::x509
