-- Small shims over the LSP and UI APIs that changed between Neovim 0.8 and 0.12.
local M = {}

M.uv = vim.uv or vim.loop

---@param version string e.g. "0.11"
function M.has(version)
  return vim.fn.has('nvim-' .. version) == 1
end

-- 0.11 turned client functions into methods (client:request); the old field style warns there.
local method_style = M.has('0.11')

---@return vim.lsp.Client[]
function M.get_clients(filter)
  if vim.lsp.get_clients then
    return vim.lsp.get_clients(filter)
  end
  local clients = vim.lsp.get_active_clients(filter) -- 0.8 - 0.9
  return clients
end

---@return boolean ok, integer? request_id
function M.request(client, method, params, handler, bufnr)
  if method_style then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

---@return table? result, string? err
function M.request_sync(client, method, params, timeout_ms, bufnr)
  if method_style then
    return client:request_sync(method, params, timeout_ms, bufnr)
  end
  return client.request_sync(method, params, timeout_ms, bufnr)
end

function M.notify(client, method, params)
  if method_style then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

function M.cancel_request(client, id)
  if method_style then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

function M.stop(client, force)
  if method_style then
    return client:stop(force)
  end
  return client.stop(force)
end

function M.is_stopped(client)
  if method_style then
    return client:is_stopped()
  end
  return client.is_stopped()
end

--- Byte column of `index` (counted in `encoding` units) in `line`.
---@param encoding string "utf-8" | "utf-16" | "utf-32"
function M.byte_col(line, index, encoding)
  if encoding == 'utf-8' then
    return math.min(index, #line)
  end
  local ok, col
  if M.has('0.11') then
    ok, col = pcall(vim.str_byteindex, line, encoding, index, false)
  else
    ok, col = pcall(vim.str_byteindex, line, index, encoding == 'utf-16')
  end
  if ok then
    return col
  end
  return #line -- an index past the end of the line
end

function M.position_params(winid, encoding)
  return vim.lsp.util.make_position_params(winid, encoding)
end

-- vim.health.start/ok/... since 0.10; report_* before.
M.health = {
  start = vim.health.start or vim.health.report_start,
  ok = vim.health.ok or vim.health.report_ok,
  info = vim.health.info or vim.health.report_info,
  warn = vim.health.warn or vim.health.report_warn,
  error = vim.health.error or vim.health.report_error,
}

--- Deep copy that turns JSON nulls (vim.NIL) into nil, so results print plainly.
function M.strip_nulls(value)
  if value == vim.NIL then
    return nil
  end
  if type(value) ~= 'table' then
    return value
  end
  local out = {}
  for k, v in pairs(value) do
    out[k] = M.strip_nulls(v)
  end
  return out
end

return M
