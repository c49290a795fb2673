-- Neovim config for the editor tests: the plugin from this repository and nothing else.
-- DRAFTWISE_TEST_CMD (JSON list) is the server command, DRAFTWISE_TEST_SETTINGS (JSON object) the
-- settings passed to setup{}.
local here = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2))
local plugin = vim.fs.normalize(here .. '/../../../editor-clients/neovim')
vim.opt.runtimepath:prepend(plugin)
vim.opt.swapfile = false
vim.opt.shadafile = 'NONE'
vim.opt.expandtab = false
vim.opt.laststatus = 2
vim.opt.statusline = '%f %= %{v:lua.require("draftwise").status()} '

local cmd = vim.json.decode((assert(os.getenv('DRAFTWISE_TEST_CMD'), 'DRAFTWISE_TEST_CMD is not set')))
local settings = vim.json.decode(os.getenv('DRAFTWISE_TEST_SETTINGS') or '{}')
-- DRAFTWISE_TEST_NATIVE_STUB=1: the 0.12 native path, against a stand-in for vim.lsp.inline_completion.
local native = os.getenv('DRAFTWISE_TEST_NATIVE_STUB') == '1'
if native then
  package.path = here .. '/?.lua;' .. package.path
  vim.lsp.inline_completion = require('native_stub')
end
require('draftwise').setup({
  cmd = cmd,
  settings = settings,
  debounce_ms = 100,
  native = native,
})
-- An auto-pairs plugin in three lines: ( [ { insert their closing bracket after the cursor.
if os.getenv('DRAFTWISE_TEST_AUTOCLOSE') == '1' then
  for open, close in pairs({ ['('] = ')', ['['] = ']', ['{'] = '}' }) do
    vim.keymap.set('i', open, open .. close .. '<Left>')
  end
end

-- Every statusline text the plugin announces (User DraftwiseStatus), for tests of short-lived ones.
_G.draftwise_status_log = {}
vim.api.nvim_create_autocmd('User', {
  pattern = 'DraftwiseStatus',
  callback = function()
    table.insert(_G.draftwise_status_log, require('draftwise').status())
  end,
})

-- What the tests read over --remote-expr: v:lua.draftwise_probe('<what>') returns JSON.
local probes = {
  state = function()
    local d = require('draftwise')
    local client = d.client()
    return {
      status = d.status(),
      stats = d.state.stats,
      error = d.state.error,
      client = client and { id = client.id, offset_encoding = client.offset_encoding,
        debounce_text_changes = client.flags and client.flags.debounce_text_changes } or nil,
      native = d._use_native(),
    }
  end,
  suggestion = function()
    return require('draftwise.ghost').suggestion()
  end,
  extmarks = function()
    local ns = require('draftwise.ghost').namespace
    return vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
  end,
  lines = function()
    return vim.api.nvim_buf_get_lines(0, 0, -1, false)
  end,
  cursor = function()
    return vim.api.nvim_win_get_cursor(0)
  end,
  mode = function()
    return vim.api.nvim_get_mode().mode
  end,
  buffer = function()
    return { name = vim.api.nvim_buf_get_name(0), lines = vim.api.nvim_buf_get_lines(0, 0, -1, false) }
  end,
  server_stats = function()
    local client = require('draftwise').client()
    local reply = client and require('draftwise.compat').request_sync(client, 'draftwise/stats', {}, 5000, 0)
    return reply and reply.result
  end,
  pending = function()
    return require('draftwise.ghost')._pending(0)
  end,
  -- The current buffer's file, and whether the server and the plugin's ghost text serve it.
  attached = function()
    local client = require('draftwise').client()
    local bufnr = vim.api.nvim_get_current_buf()
    local ghost = pcall(vim.api.nvim_get_autocmds, { group = 'draftwise_ghost_' .. bufnr })
    return { name = vim.api.nvim_buf_get_name(bufnr), lsp = client ~= nil and vim.lsp.buf_is_attached(bufnr, client.id),
      ghost = ghost, native = require('draftwise')._use_native() }
  end,
  messages = function()
    return vim.api.nvim_exec2('messages', { output = true }).output
  end,
  status = function()
    return require('draftwise').status()
  end,
  status_log = function()
    return _G.draftwise_status_log
  end,
  native_stub = function()
    local stub = vim.lsp.inline_completion
    return { applied_by_default = stub.applied_by_default or 0, calls = stub.calls, index = stub.index }
  end,
}

function _G.draftwise_probe(what)
  local ok, value = pcall(probes[what])
  if not ok then
    return vim.json.encode({ probe_error = tostring(value) })
  end
  return vim.json.encode(value == nil and vim.NIL or value)
end
