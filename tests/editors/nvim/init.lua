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
require('draftwise').setup({
  cmd = cmd,
  settings = settings,
  debounce_ms = 100,
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
      client = client and { id = client.id, offset_encoding = client.offset_encoding } or nil,
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
  messages = function()
    return vim.api.nvim_exec2('messages', { output = true }).output
  end,
}

function _G.draftwise_probe(what)
  local ok, value = pcall(probes[what])
  if not ok then
    return vim.json.encode({ probe_error = tostring(value) })
  end
  return vim.json.encode(value == nil and vim.NIL or value)
end
