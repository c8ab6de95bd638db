-- serve_wrk.lua: a wrk script posting one KServe v2 infer request body to `ember serve`, the standard-generator
-- cross-check of bench/serve_load.c.
--
--   BODY=req.json wrk -t2 -c16 -d10s -s bench/serve_wrk.lua http://127.0.0.1:8000/v2/models/NAME/infer
--   BODY=req.bin HEADER_LEN=123 wrk ... (the binary tensor extension: Inference-Header-Content-Length: 123)
--
-- The body is the file named by BODY; Content-Type is application/json, or application/octet-stream when HEADER_LEN
-- is set (then sent as Inference-Header-Content-Length). Responses other than 200 are counted per thread. done()
-- prints one line:
--
--   wrk: requests N seconds S rps R p50_ms A p95_ms B p99_ms C max_ms D non200 K socket_errors E timeouts T

local body_path = os.getenv("BODY")
if not body_path or body_path == "" then
    error("serve_wrk.lua: set BODY to the request body file")
end
local f = assert(io.open(body_path, "rb"), "serve_wrk.lua: cannot open BODY file " .. body_path)
local body = f:read("*a")
f:close()

local header_len = os.getenv("HEADER_LEN")
wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Length"] = tostring(#body)
if header_len and header_len ~= "" then
    wrk.headers["Content-Type"] = "application/octet-stream"
    wrk.headers["Inference-Header-Content-Length"] = header_len
else
    wrk.headers["Content-Type"] = "application/json"
end

-- Main-state list of the threads, to read their counters in done().
local threads = {}
function setup(thread)
    table.insert(threads, thread)
end

-- Per-thread state (each thread runs its own copy of this script).
non200 = 0
function response(status, headers, body)
    if status ~= 200 then
        non200 = non200 + 1
    end
end

function done(summary, latency, requests)
    local bad = 0
    for _, t in ipairs(threads) do
        bad = bad + (t:get("non200") or 0)
    end
    local e = summary.errors
    local secs = summary.duration / 1e6
    io.write(string.format("wrk: requests %d seconds %.2f rps %.1f p50_ms %.3f p95_ms %.3f p99_ms %.3f max_ms %.3f "
                           .. "non200 %d socket_errors %d timeouts %d\n",
                           summary.requests, secs, summary.requests / secs, latency:percentile(50) / 1e3,
                           latency:percentile(95) / 1e3, latency:percentile(99) / 1e3, latency.max / 1e3, bad,
                           e.connect + e.read + e.write, e.timeout))
end
