// Generated from gateway/openapi/openapi.yaml by `npm run generate:client`. Do not edit: a test
// fails when this file and the document disagree.
//
//   import createClient from 'openapi-fetch'
//   import type { paths } from './schema.ts'
//   const client = createClient<paths>({ baseUrl: 'https://api.example.com/v1', headers: { authorization: 'Bearer …' } })

export interface paths {
    "/pets": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * List animals
         * @description Returns a page of animals as a bare JSON array, in ascending `id` order. While more
         *     animals follow, the response carries `Link: <…>; rel="next"`, a URL of the next page
         *     with an opaque `cursor`; follow it as it is. Unknown query parameters are refused
         *     with 400.
         */
        get: operations["listPets"];
        put?: never;
        /**
         * Add an animal
         * @description Adds an animal; the service assigns its `id`. The name is trimmed and must then hold
         *     1 to 100 characters. `status` defaults to `available`. Unknown fields, and an `id`,
         *     are refused with 400.
         *
         *     Send an `Idempotency-Key` to make a retry safe: a retry with the same key and the same
         *     body returns the first result (with `Idempotent-Replayed: true`) and adds nothing; the
         *     same key with a different body gets 422. Keys are scoped to the API key and kept 24 hours.
         */
        post: operations["createPet"];
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/pets/{petId}": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * Get one animal (deprecated)
         * @deprecated
         * @description **Deprecated.** This operation is scheduled for removal on 2030-12-05 (5 December 2030).
         *     Use `GET /pets` with the `status` filter instead.
         *
         *     Its answers carry `Deprecation` (RFC 9745), `Sunset` (RFC 8594) and a `Link` to the
         *     successor. A malformed `petId` (not a positive integer in the int64 range, or written
         *     with leading zeros) gets 400; a well-formed id of no animal gets 404.
         */
        get: operations["getPet"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/store/orders": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * List store orders (not available yet)
         * @description Store orders exist but are not available yet: after authentication and rate limiting
         *     this operation answers 501 `not_implemented`. Orders and their fields are not
         *     documented.
         */
        get: operations["listStoreOrders"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
    "/openapi.json": {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        /**
         * This document
         * @description This OpenAPI document as JSON. No API key is needed; requests are limited per client
         *     IP like other requests without a key. The interactive page is at `/docs` beside `/v1`.
         */
        get: operations["getOpenApiDocument"];
        put?: never;
        post?: never;
        delete?: never;
        options?: never;
        head?: never;
        patch?: never;
        trace?: never;
    };
}
export type webhooks = Record<string, never>;
export interface components {
    schemas: {
        /**
         * @description Availability of the animal.
         * @enum {string}
         */
        PetStatus: "available" | "pending" | "sold";
        /** @description An animal to add. */
        NewPet: {
            /**
             * @description The animal's name, stored trimmed: white space and invisible characters at either end
             *     (zero-width, format and default-ignorable ones: `"Rex\u200b"` and `"Rex\uFE0F"` are
             *     stored as `Rex`, as are `"Rex \u0301"` and `"\u0301Rex"`, whose accent marks no
             *     letter) are removed first. Then it must hold 1 to 100 characters (code points),
             *     well-formed (no lone surrogate), with no control characters (C0, DEL, C1), no line or
             *     paragraph separator (U+2028, U+2029), no bidirectional override, embedding or isolate
             *     (U+202A–U+202E, U+2066–U+2069), and at least one visible character; otherwise 400
             *     `validation_failed`. Before trimming it may be at most 1,000 characters long.
             * @example Rex
             */
            name: string;
            /**
             * Format: int64
             * @description Identifier of the category the animal belongs to (at most 2^53 − 1).
             * @example 2
             */
            categoryId: number;
            status?: components["schemas"]["PetStatus"];
        };
        /** @description An animal as returned. `status` is always present (`available` unless set on creation). */
        Pet: {
            /**
             * Format: int64
             * @description Unique identifier assigned by the service on creation.
             * @example 1
             */
            id: number;
            /**
             * @description The animal's name.
             * @example Rex
             */
            name: string;
            /**
             * Format: int64
             * @description Identifier of the category the animal belongs to.
             * @example 2
             */
            categoryId: number;
            status: components["schemas"]["PetStatus"];
        };
        /** @description Every error response. `status` repeats the HTTP status code. */
        Error: {
            /**
             * @description Machine-readable error code:
             *
             *     - `bad_request` (400): the request could not be understood.
             *     - `validation_failed` (400): a body, query, path or header value breaks the rules; the message names it.
             *     - `invalid_json` (400): the body is not JSON, is not UTF-8, or is empty.
             *     - `missing_api_key` (401): no `Authorization: Bearer` key.
             *     - `invalid_api_key` (401): a malformed, unknown, revoked or expired key.
             *     - `not_found` (404): no route matches this path.
             *     - `method_not_allowed` (405): the path exists but does not answer this method; `Allow` lists the methods it answers.
             *     - `request_timeout` (408): the request headers did not arrive within 10 s, or the whole request within 30 s.
             *     - `pet_not_found` (404): no animal has this id.
             *     - `payload_too_large` (413): the body is larger than 1 MiB.
             *     - `uri_too_long` (414): the request target (path and query) is longer than 16 KiB.
             *     - `unsupported_media_type` (415): the body is not `application/json`, is compressed, or is not UTF-8.
             *     - `headers_too_large` (431): the request line and headers together are larger than 16 KiB, or more than 1,000 header lines.
             *     - `idempotency_key_reused` (422): the `Idempotency-Key` was already used with a different body.
             *     - `rate_limited` (429): over the limit; retry after `Retry-After` seconds.
             *     - `api_key_banned` (429): the key is banned for sending requests while limited; retry after `Retry-After` seconds.
             *     - `internal_error` (500): a defect on the service's side.
             *     - `not_implemented` (501): the operation is not available yet.
             *     - `bad_gateway` (502): the catalogue service could not be reached or answered badly.
             *     - `service_unavailable` (503): a dependency is unavailable; retry after `Retry-After` seconds.
             *     - `upstream_timeout` (504): the catalogue service did not answer in time.
             *     - `http_version_not_supported` (505): the request line names an HTTP version other than 1.x (`HTTP/2.0`, `HTTP/0.9`); send it as HTTP/1.1.
             * @enum {string}
             */
            code: "bad_request" | "validation_failed" | "invalid_json" | "missing_api_key" | "invalid_api_key" | "not_found" | "pet_not_found" | "method_not_allowed" | "request_timeout" | "payload_too_large" | "uri_too_long" | "unsupported_media_type" | "headers_too_large" | "idempotency_key_reused" | "rate_limited" | "api_key_banned" | "internal_error" | "not_implemented" | "bad_gateway" | "service_unavailable" | "upstream_timeout" | "http_version_not_supported";
            /** @description Human-readable description. */
            message: string;
            /** @description The HTTP status code. */
            status: number;
        };
    };
    responses: {
        /**
         * @description The request is invalid: `validation_failed` (a parameter, header or body value breaks
         *     the rules; the message names it), `invalid_json`, or `bad_request` (the request could
         *     not be understood, e.g. a malformed URL encoding). One exception to the headers below: a
         *     request line the HTTP parser refuses before the request is read (bytes HTTP does not
         *     allow in it, such as a space or a non-ASCII byte sent raw in the query: percent-encode
         *     them) gets `bad_request` as 408, 414 and 431 do, not authenticated, not counted, without
         *     rate-limit headers or request id, and the connection is closed.
         */
        BadRequest: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "validation_failed",
                 *       "message": "body must have required property 'categoryId'",
                 *       "status": 400
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description The API key is missing (`missing_api_key`) or invalid (`invalid_api_key`). */
        Unauthorized: {
            headers: {
                "WWW-Authenticate": components["headers"]["WWW-Authenticate"];
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "missing_api_key",
                 *       "message": "Send your API key as \"Authorization: Bearer <key>\".",
                 *       "status": 401
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description No animal has this id (`pet_not_found`). */
        PetNotFound: {
            headers: {
                Deprecation: components["headers"]["Deprecation"];
                Sunset: components["headers"]["Sunset"];
                Link: components["headers"]["LinkSuccessor"];
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "pet_not_found",
                 *       "message": "No animal has this id.",
                 *       "status": 404
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description The body is larger than 1 MiB (`payload_too_large`). */
        PayloadTooLarge: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "payload_too_large",
                 *       "message": "The request body is larger than 1 MiB.",
                 *       "status": 413
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description The body is not `application/json`, is compressed (`Content-Encoding`), or declares a charset other than UTF-8 (`unsupported_media_type`). */
        UnsupportedMediaType: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "unsupported_media_type",
                 *       "message": "The request body must be application/json.",
                 *       "status": 415
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description The `Idempotency-Key` was already used with a different body (`idempotency_key_reused`). */
        IdempotencyKeyReused: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "idempotency_key_reused",
                 *       "message": "This Idempotency-Key was already used with a different request body.",
                 *       "status": 422
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description The request headers did not arrive within 10 s, or the whole request within 30 s
         *     (`request_timeout`). The HTTP parser refuses such a request before it is read, so it
         *     is neither authenticated nor counted against any limit, and the answer carries no
         *     rate-limit headers; the connection is closed.
         */
        RequestTimeout: {
            headers: {
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "request_timeout",
                 *       "message": "The request was not received in time.",
                 *       "status": 408
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description The request target (path and query) is longer than 16 KiB (`uri_too_long`). Like
         *     `headers_too_large`, the HTTP parser refuses it before it is read: not authenticated,
         *     not counted, no rate-limit headers; the connection is closed.
         */
        UriTooLong: {
            headers: {
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "uri_too_long",
                 *       "message": "The request target (path and query) is longer than 16 KiB.",
                 *       "status": 414
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description The request line and headers together are larger than 16 KiB, or more than 1,000
         *     header lines (`headers_too_large`). Such a request is refused before it is read, so it
         *     is neither authenticated nor counted against any limit, and the answer carries no
         *     rate-limit headers; the connection is closed.
         */
        HeadersTooLarge: {
            headers: {
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "headers_too_large",
                 *       "message": "The request line and headers together are larger than 16 KiB.",
                 *       "status": 431
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description Over the rate limit (`rate_limited`), or the key is temporarily banned for sending
         *     requests while limited (`api_key_banned`). Wait `Retry-After` seconds, then retry;
         *     back off exponentially.
         */
        TooManyRequests: {
            headers: {
                "Retry-After": components["headers"]["Retry-After"];
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "rate_limited",
                 *       "message": "Too many requests; retry after the time in Retry-After.",
                 *       "status": 429
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description A defect on the service's side (`internal_error`); the request id identifies it in the logs. */
        InternalError: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "internal_error",
                 *       "message": "Something went wrong on our side.",
                 *       "status": 500
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description The operation is not available yet (`not_implemented`). */
        NotImplemented: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "not_implemented",
                 *       "message": "Store orders are not available yet.",
                 *       "status": 501
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description The body was sent with a transfer coding besides `chunked` (`Transfer-Encoding: gzip,
         *     chunked`), which the gateway does not decode (`not_implemented`, RFC 9112 §6.1). Send the
         *     body chunked or with `Content-Length`. The request is counted against the limits
         *     like any other, and not carried out. A method the HTTP parser does not know (`FOO`, a
         *     lower-case `get`) or `CONNECT` is also answered `not_implemented`, but by the parser,
         *     before the request is read: not counted, without rate-limit headers or request id, and
         *     the connection is closed.
         */
        TransferCodingNotImplemented: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "not_implemented",
                 *       "message": "No transfer coding but chunked is supported; send the body chunked or with a Content-Length.",
                 *       "status": 501
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description The catalogue service could not be reached or answered badly (`bad_gateway`). When it
         *     refused the connection (it is restarting), the request was not sent, and `Retry-After`
         *     says when to send it again.
         */
        BadGateway: {
            headers: {
                /**
                 * @description Seconds to wait before sending the request again; only when the catalogue refused the connection.
                 * @example 1
                 */
                "Retry-After"?: number;
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "bad_gateway",
                 *       "message": "The catalogue service could not be reached or answered badly.",
                 *       "status": 502
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description A dependency is unavailable (`service_unavailable`): the key store for a key not seen
         *     recently, the rate-limit store when the operator chose to fail closed, or the
         *     catalogue's database. Retry after `Retry-After` seconds. A gateway that is shutting down
         *     answers a request arriving meanwhile the same way (`Retry-After: 1`: another instance
         *     takes it) before looking at its key, so without rate-limit headers.
         */
        ServiceUnavailable: {
            headers: {
                "Retry-After": components["headers"]["Retry-After"];
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "service_unavailable",
                 *       "message": "The service is temporarily unavailable; retry shortly.",
                 *       "status": 503
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /** @description The catalogue service did not answer in time (`upstream_timeout`). */
        GatewayTimeout: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "upstream_timeout",
                 *       "message": "The catalogue service did not answer in time.",
                 *       "status": 504
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
        /**
         * @description The request line names an HTTP version other than 1.x, such as `HTTP/2.0` or `HTTP/0.9`
         *     (`http_version_not_supported`). The gateway speaks HTTP/1.1 (and HTTP/1.0); the request
         *     is counted against the limits like any other, not carried out, and the connection is
         *     closed after the answer.
         */
        HttpVersionNotSupported: {
            headers: {
                "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                RateLimit: components["headers"]["RateLimit"];
                "X-Request-Id": components["headers"]["X-Request-Id"];
                [name: string]: unknown;
            };
            content: {
                /**
                 * @example {
                 *       "code": "http_version_not_supported",
                 *       "message": "This server speaks HTTP/1.1 (and HTTP/1.0) only; send the request as HTTP/1.1.",
                 *       "status": 505
                 *     }
                 */
                "application/json": components["schemas"]["Error"];
            };
        };
    };
    parameters: never;
    requestBodies: never;
    headers: {
        /**
         * @description The request limit of the window closest to exhaustion.
         * @example 60
         */
        "X-RateLimit-Limit": number;
        /**
         * @description Requests left in that window (never negative).
         * @example 59
         */
        "X-RateLimit-Remaining": number;
        /**
         * @description Unix time in seconds at which that window's limit resets.
         * @example 1767225660
         */
        "X-RateLimit-Reset": number;
        /**
         * @description Every window that applies (IETF draft `RateLimit-Policy`): quota `q` per `w` seconds.
         * @example "minute";q=60;w=60, "day";q=1000;w=86400
         */
        "RateLimit-Policy": string;
        /**
         * @description Every window's state (IETF draft `RateLimit`): `r` requests remaining, reset in `t` seconds.
         * @example "minute";r=59;t=60, "day";r=999;t=3600
         */
        RateLimit: string;
        /**
         * @description Seconds to wait before retrying (whole seconds, at least 1).
         * @example 17
         */
        "Retry-After": number;
        /** @description The request's id (the client's own `X-Request-Id` when it sent a well-formed one); quote it when asking for support. */
        "X-Request-Id": string;
        /**
         * @description The path of the added animal.
         * @example /v1/pets/1
         */
        Location: string;
        /** @description `true` when this is the stored result of an earlier request with the same `Idempotency-Key`. */
        "Idempotent-Replayed": "true";
        /**
         * @description The next page while more animals follow: `<…>; rel="next"`.
         * @example </v1/pets?limit=20&cursor=cDE6MjA>; rel="next"
         */
        LinkNext: string;
        /**
         * @description The operation that replaces this one (`rel="successor-version"`).
         * @example </v1/pets>; rel="successor-version"
         */
        LinkSuccessor: string;
        /**
         * @description When the operation was deprecated (RFC 9745, Unix seconds).
         * @example @1767225600
         */
        Deprecation: string;
        /** @description When the operation will be removed (RFC 8594). */
        Sunset: "Thu, 05 Dec 2030 00:00:00 GMT";
        /**
         * @description The bearer challenge (RFC 6750): with `error="invalid_token"` when a bearer key was sent and refused; without an error code when no key was sent or another scheme was used.
         * @example Bearer realm="animal-adoption-store", error="invalid_token"
         */
        "WWW-Authenticate": string;
    };
    pathItems: never;
}
export type SchemaPetStatus = components['schemas']['PetStatus'];
export type SchemaNewPet = components['schemas']['NewPet'];
export type SchemaPet = components['schemas']['Pet'];
export type SchemaError = components['schemas']['Error'];
export type ResponseBadRequest = components['responses']['BadRequest'];
export type ResponseUnauthorized = components['responses']['Unauthorized'];
export type ResponsePetNotFound = components['responses']['PetNotFound'];
export type ResponsePayloadTooLarge = components['responses']['PayloadTooLarge'];
export type ResponseUnsupportedMediaType = components['responses']['UnsupportedMediaType'];
export type ResponseIdempotencyKeyReused = components['responses']['IdempotencyKeyReused'];
export type ResponseRequestTimeout = components['responses']['RequestTimeout'];
export type ResponseUriTooLong = components['responses']['UriTooLong'];
export type ResponseHeadersTooLarge = components['responses']['HeadersTooLarge'];
export type ResponseTooManyRequests = components['responses']['TooManyRequests'];
export type ResponseInternalError = components['responses']['InternalError'];
export type ResponseNotImplemented = components['responses']['NotImplemented'];
export type ResponseTransferCodingNotImplemented = components['responses']['TransferCodingNotImplemented'];
export type ResponseBadGateway = components['responses']['BadGateway'];
export type ResponseServiceUnavailable = components['responses']['ServiceUnavailable'];
export type ResponseGatewayTimeout = components['responses']['GatewayTimeout'];
export type ResponseHttpVersionNotSupported = components['responses']['HttpVersionNotSupported'];
export type HeaderXRateLimitLimit = components['headers']['X-RateLimit-Limit'];
export type HeaderXRateLimitRemaining = components['headers']['X-RateLimit-Remaining'];
export type HeaderXRateLimitReset = components['headers']['X-RateLimit-Reset'];
export type HeaderRateLimitPolicy = components['headers']['RateLimit-Policy'];
export type HeaderRateLimit = components['headers']['RateLimit'];
export type HeaderRetryAfter = components['headers']['Retry-After'];
export type HeaderXRequestId = components['headers']['X-Request-Id'];
export type HeaderLocation = components['headers']['Location'];
export type HeaderIdempotentReplayed = components['headers']['Idempotent-Replayed'];
export type HeaderLinkNext = components['headers']['LinkNext'];
export type HeaderLinkSuccessor = components['headers']['LinkSuccessor'];
export type HeaderDeprecation = components['headers']['Deprecation'];
export type HeaderSunset = components['headers']['Sunset'];
export type HeaderWwwAuthenticate = components['headers']['WWW-Authenticate'];
export type $defs = Record<string, never>;
export interface operations {
    listPets: {
        parameters: {
            query?: {
                /** @description Maximum number of animals returned, in plain decimal digits (`05`, `5.0`, `+5`, `1e1` get 400). */
                limit?: number;
                /** @description Restricts the result to animals with this status. */
                status?: components["schemas"]["PetStatus"];
                /** @description Opaque position in the catalogue, taken from the `Link` header of the previous page. */
                cursor?: string;
            };
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            /** @description Success. */
            200: {
                headers: {
                    Link: components["headers"]["LinkNext"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example [
                     *       {
                     *         "id": 1,
                     *         "name": "Rex",
                     *         "categoryId": 2,
                     *         "status": "available"
                     *       }
                     *     ]
                     */
                    "application/json": components["schemas"]["Pet"][];
                };
            };
            400: components["responses"]["BadRequest"];
            401: components["responses"]["Unauthorized"];
            408: components["responses"]["RequestTimeout"];
            414: components["responses"]["UriTooLong"];
            429: components["responses"]["TooManyRequests"];
            431: components["responses"]["HeadersTooLarge"];
            500: components["responses"]["InternalError"];
            501: components["responses"]["TransferCodingNotImplemented"];
            502: components["responses"]["BadGateway"];
            503: components["responses"]["ServiceUnavailable"];
            504: components["responses"]["GatewayTimeout"];
            505: components["responses"]["HttpVersionNotSupported"];
        };
    };
    createPet: {
        parameters: {
            query?: never;
            header?: {
                /** @description A unique value per animal to add, 1 to 255 visible ASCII characters. */
                "Idempotency-Key"?: string;
            };
            path?: never;
            cookie?: never;
        };
        requestBody: {
            content: {
                /**
                 * @example {
                 *       "name": "Rex",
                 *       "categoryId": 2,
                 *       "status": "available"
                 *     }
                 */
                "application/json": components["schemas"]["NewPet"];
            };
        };
        responses: {
            /** @description Animal added; the body carries the assigned `id`. */
            201: {
                headers: {
                    Location: components["headers"]["Location"];
                    "Idempotent-Replayed": components["headers"]["Idempotent-Replayed"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "id": 1,
                     *       "name": "Rex",
                     *       "categoryId": 2,
                     *       "status": "available"
                     *     }
                     */
                    "application/json": components["schemas"]["Pet"];
                };
            };
            400: components["responses"]["BadRequest"];
            401: components["responses"]["Unauthorized"];
            408: components["responses"]["RequestTimeout"];
            413: components["responses"]["PayloadTooLarge"];
            414: components["responses"]["UriTooLong"];
            415: components["responses"]["UnsupportedMediaType"];
            422: components["responses"]["IdempotencyKeyReused"];
            429: components["responses"]["TooManyRequests"];
            431: components["responses"]["HeadersTooLarge"];
            500: components["responses"]["InternalError"];
            501: components["responses"]["TransferCodingNotImplemented"];
            502: components["responses"]["BadGateway"];
            503: components["responses"]["ServiceUnavailable"];
            504: components["responses"]["GatewayTimeout"];
            505: components["responses"]["HttpVersionNotSupported"];
        };
    };
    getPet: {
        parameters: {
            query?: never;
            header?: never;
            path: {
                /** @description The identifier of the animal. */
                petId: number;
            };
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            /** @description Animal found. */
            200: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "id": 1,
                     *       "name": "Rex",
                     *       "categoryId": 2,
                     *       "status": "available"
                     *     }
                     */
                    "application/json": components["schemas"]["Pet"];
                };
            };
            /**
             * @description The request is invalid: `validation_failed` (a parameter, header or body value breaks
             *     the rules; the message names it), `invalid_json`, or `bad_request` (the request could
             *     not be understood, e.g. a malformed URL encoding). One exception to the headers below: a
             *     request line the HTTP parser refuses before the request is read (bytes HTTP does not
             *     allow in it, such as a space or a non-ASCII byte sent raw in the query: percent-encode
             *     them) gets `bad_request` as 408, 414 and 431 do, not authenticated, not counted, without
             *     rate-limit headers or request id, and the connection is closed.
             */
            400: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "validation_failed",
                     *       "message": "body must have required property 'categoryId'",
                     *       "status": 400
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            /** @description The API key is missing (`missing_api_key`) or invalid (`invalid_api_key`). */
            401: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "WWW-Authenticate": components["headers"]["WWW-Authenticate"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "missing_api_key",
                     *       "message": "Send your API key as \"Authorization: Bearer <key>\".",
                     *       "status": 401
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            404: components["responses"]["PetNotFound"];
            408: components["responses"]["RequestTimeout"];
            414: components["responses"]["UriTooLong"];
            /**
             * @description Over the rate limit (`rate_limited`), or the key is temporarily banned for sending
             *     requests while limited (`api_key_banned`). Wait `Retry-After` seconds, then retry;
             *     back off exponentially.
             */
            429: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "Retry-After": components["headers"]["Retry-After"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "rate_limited",
                     *       "message": "Too many requests; retry after the time in Retry-After.",
                     *       "status": 429
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            431: components["responses"]["HeadersTooLarge"];
            /** @description A defect on the service's side (`internal_error`); the request id identifies it in the logs. */
            500: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "internal_error",
                     *       "message": "Something went wrong on our side.",
                     *       "status": 500
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            /**
             * @description The body was sent with a transfer coding besides `chunked` (`Transfer-Encoding: gzip,
             *     chunked`), which the gateway does not decode (`not_implemented`, RFC 9112 §6.1). Send the
             *     body chunked or with `Content-Length`. The request is counted against the limits
             *     like any other, and not carried out. A method the HTTP parser does not know (`FOO`, a
             *     lower-case `get`) or `CONNECT` is also answered `not_implemented`, but by the parser,
             *     before the request is read: not counted, without rate-limit headers or request id, and
             *     the connection is closed.
             */
            501: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "not_implemented",
                     *       "message": "No transfer coding but chunked is supported; send the body chunked or with a Content-Length.",
                     *       "status": 501
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            /**
             * @description The catalogue service could not be reached or answered badly (`bad_gateway`). When it
             *     refused the connection (it is restarting), the request was not sent, and `Retry-After`
             *     says when to send it again.
             */
            502: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    /**
                     * @description Seconds to wait before sending the request again; only when the catalogue refused the connection.
                     * @example 1
                     */
                    "Retry-After"?: number;
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "bad_gateway",
                     *       "message": "The catalogue service could not be reached or answered badly.",
                     *       "status": 502
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            /**
             * @description A dependency is unavailable (`service_unavailable`): the key store for a key not seen
             *     recently, the rate-limit store when the operator chose to fail closed, or the
             *     catalogue's database. Retry after `Retry-After` seconds. A gateway that is shutting down
             *     answers a request arriving meanwhile the same way (`Retry-After: 1`: another instance
             *     takes it) before looking at its key, so without rate-limit headers.
             */
            503: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "Retry-After": components["headers"]["Retry-After"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "service_unavailable",
                     *       "message": "The service is temporarily unavailable; retry shortly.",
                     *       "status": 503
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            /** @description The catalogue service did not answer in time (`upstream_timeout`). */
            504: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "upstream_timeout",
                     *       "message": "The catalogue service did not answer in time.",
                     *       "status": 504
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
            /**
             * @description The request line names an HTTP version other than 1.x, such as `HTTP/2.0` or `HTTP/0.9`
             *     (`http_version_not_supported`). The gateway speaks HTTP/1.1 (and HTTP/1.0); the request
             *     is counted against the limits like any other, not carried out, and the connection is
             *     closed after the answer.
             */
            505: {
                headers: {
                    Deprecation: components["headers"]["Deprecation"];
                    Sunset: components["headers"]["Sunset"];
                    Link: components["headers"]["LinkSuccessor"];
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    /**
                     * @example {
                     *       "code": "http_version_not_supported",
                     *       "message": "This server speaks HTTP/1.1 (and HTTP/1.0) only; send the request as HTTP/1.1.",
                     *       "status": 505
                     *     }
                     */
                    "application/json": components["schemas"]["Error"];
                };
            };
        };
    };
    listStoreOrders: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            400: components["responses"]["BadRequest"];
            401: components["responses"]["Unauthorized"];
            408: components["responses"]["RequestTimeout"];
            414: components["responses"]["UriTooLong"];
            429: components["responses"]["TooManyRequests"];
            431: components["responses"]["HeadersTooLarge"];
            500: components["responses"]["InternalError"];
            501: components["responses"]["NotImplemented"];
            503: components["responses"]["ServiceUnavailable"];
            505: components["responses"]["HttpVersionNotSupported"];
        };
    };
    getOpenApiDocument: {
        parameters: {
            query?: never;
            header?: never;
            path?: never;
            cookie?: never;
        };
        requestBody?: never;
        responses: {
            /** @description The OpenAPI document. */
            200: {
                headers: {
                    "X-RateLimit-Limit": components["headers"]["X-RateLimit-Limit"];
                    "X-RateLimit-Remaining": components["headers"]["X-RateLimit-Remaining"];
                    "X-RateLimit-Reset": components["headers"]["X-RateLimit-Reset"];
                    "RateLimit-Policy": components["headers"]["RateLimit-Policy"];
                    RateLimit: components["headers"]["RateLimit"];
                    "X-Request-Id": components["headers"]["X-Request-Id"];
                    [name: string]: unknown;
                };
                content: {
                    "application/json": {
                        openapi: string;
                        info: Record<string, never>;
                        paths: Record<string, never>;
                    };
                };
            };
            400: components["responses"]["BadRequest"];
            408: components["responses"]["RequestTimeout"];
            414: components["responses"]["UriTooLong"];
            429: components["responses"]["TooManyRequests"];
            431: components["responses"]["HeadersTooLarge"];
            500: components["responses"]["InternalError"];
            505: components["responses"]["HttpVersionNotSupported"];
        };
    };
}
