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
