-- sha1hex(text): Redis's redis.sha1hex, or, where the server has none (the embedded store runs
-- scripts on a Lua without it or any bit library), SHA-1 in plain Lua arithmetic: slow, but the
-- embedded store serves one process and hashes only audit records, never values.
-- The fallback is kept on the `redis` table (its byte tables take a while to build), so each
-- script runtime builds it once.
if not redis.sha1hex then
  local X8, A8, O8 = {}, {}, {}
  for a = 0, 255 do
    for b = 0, 255 do
      local x, n, o, bit = 0, 0, 0, 1
      local p, q = a, b
      for _ = 1, 8 do
        local pa, qb = p % 2, q % 2
        if pa ~= qb then x = x + bit end
        if pa == 1 and qb == 1 then n = n + bit end
        if pa == 1 or qb == 1 then o = o + bit end
        p, q, bit = (p - pa) / 2, (q - qb) / 2, bit * 2
      end
      local i = a * 256 + b
      X8[i], A8[i], O8[i] = x, n, o
    end
  end
  local function op(t, a, b)
    local a1, b1 = a % 256, b % 256
    a, b = (a - a1) / 256, (b - b1) / 256
    local a2, b2 = a % 256, b % 256
    a, b = (a - a2) / 256, (b - b2) / 256
    local a3, b3 = a % 256, b % 256
    a, b = (a - a3) / 256, (b - b3) / 256
    return t[a1 * 256 + b1] + t[a2 * 256 + b2] * 256 + t[a3 * 256 + b3] * 65536
      + t[a * 256 + b] * 16777216
  end
  local M = 4294967296
  local function rol(x, n)
    local s = 2 ^ (32 - n)
    return (x % s) * 2 ^ n + math.floor(x / s)
  end
  redis.sha1hex = function(msg)
    local len = #msg
    msg = msg .. '\128' .. string.rep('\0', (55 - len) % 64)
    local bits = len * 8
    local tail = {}
    for i = 8, 1, -1 do
      tail[i] = string.char(bits % 256)
      bits = math.floor(bits / 256)
    end
    msg = msg .. table.concat(tail)
    local h0, h1, h2, h3, h4 = 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0
    local w = {}
    for chunk = 1, #msg, 64 do
      for i = 0, 15 do
        local b1, b2, b3, b4 = string.byte(msg, chunk + i * 4, chunk + i * 4 + 3)
        w[i] = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
      end
      for i = 16, 79 do
        w[i] = rol(op(X8, op(X8, w[i - 3], w[i - 8]), op(X8, w[i - 14], w[i - 16])), 1)
      end
      local a, b, c, d, e = h0, h1, h2, h3, h4
      for i = 0, 79 do
        local f, k
        if i < 20 then
          f, k = op(X8, d, op(A8, b, op(X8, c, d))), 0x5A827999
        elseif i < 40 then
          f, k = op(X8, op(X8, b, c), d), 0x6ED9EBA1
        elseif i < 60 then
          f, k = op(O8, op(A8, b, c), op(A8, d, op(O8, b, c))), 0x8F1BBCDC
        else
          f, k = op(X8, op(X8, b, c), d), 0xCA62C1D6
        end
        a, b, c, d, e = (rol(a, 5) + f + e + k + w[i]) % M, a, rol(b, 30), c, d
      end
      h0, h1, h2 = (h0 + a) % M, (h1 + b) % M, (h2 + c) % M
      h3, h4 = (h3 + d) % M, (h4 + e) % M
    end
    return string.format('%08x%08x%08x%08x%08x', h0, h1, h2, h3, h4)
  end
end
local sha1hex = redis.sha1hex
