// A self-signed test CA (P-256, valid until 2126), for the unit and the
// end-to-end tests of --ca-cert.
#pragma once

inline constexpr const char* kTestCa = R"(-----BEGIN CERTIFICATE-----
MIIBljCCAT2gAwIBAgIUdjU/N9EhRLqNMFH9kJft8BIciEEwCgYIKoZIzj0EAwIw
IDEeMBwGA1UEAwwVb3BlbnNoZWxsLWUyZS10ZXN0LWNhMCAXDTI2MTIwMTExNDE1
MFoYDzIxMjYxMTA3MTE0MTUwWjAgMR4wHAYDVQQDDBVvcGVuc2hlbGwtZTJlLXRl
c3QtY2EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARmZ8dx3pqZZBrwZ2b2dleM
xqa4cuVBze5NIWMGHNDpDficAanb4Uuzt5QVJIWao7+SSx8SBa6n2vUBsPSrUtlj
o1MwUTAdBgNVHQ4EFgQUpNX/qBYaTEFQMLgQsIb/oIe6d0IwHwYDVR0jBBgwFoAU
pNX/qBYaTEFQMLgQsIb/oIe6d0IwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQD
AgNHADBEAiApI0T/jfLf7A8iEVuZBZM0j4/Dw8X8fx9I5WbL6kGrhwIgGApdE+Fo
RhgEhedqotnvgpPVvfHb1r6BFu52qQTvHJo=
-----END CERTIFICATE-----
)";
