-- :checkhealth draftwise
local compat = require('draftwise.compat')

local M = {}

function M.check()
  local h = compat.health
  local draftwise = require('draftwise')

  h.start('draftwise')
  if not compat.has('0.8') then
    h.error('Neovim 0.8 or newer is needed (vim.lsp.start)')
    return
  end
  local v = vim.version()
  if draftwise._use_native() then
    h.ok(('Neovim %d.%d.%d: inline suggestions from vim.lsp.inline_completion'):format(v.major, v.minor, v.patch))
  else
    h.ok(('Neovim %d.%d.%d: inline suggestions from the plugin\'s own client'):format(v.major, v.minor, v.patch))
  end

  if not draftwise.state.setup_done then
    h.warn('require("draftwise").setup{} has not been called')
    return
  end

  local root = draftwise.root_dir(vim.api.nvim_get_current_buf())
  local cmd, why = draftwise.server_cmd(root)
  if cmd then
    h.ok('server command: ' .. table.concat(cmd, ' '))
  else
    h.error(why, { 'pip install draftwise into the project\'s .venv, or pass cmd = { ... } to setup{}' })
  end

  local settings = draftwise.server_settings()
  if vim.tbl_isempty(settings) then
    h.info('settings: none set; the server uses its defaults')
  else
    h.info('settings: ' .. vim.inspect(settings, { newline = ' ', indent = '' }))
  end

  local client = draftwise.client()
  if not client then
    if draftwise.state.error then
      h.error(draftwise.state.error)
    else
      h.info('server not running (it starts when a file buffer opens)')
    end
    return
  end
  h.ok(('server running (client id %d, position encoding %s)'):format(client.id, client.offset_encoding))
  local reply = compat.request_sync(client, 'draftwise/stats', {}, 3000, vim.api.nvim_get_current_buf())
  local stats = reply and reply.result and compat.strip_nulls(reply.result)
  if not stats then
    h.warn('draftwise/stats did not answer: ' .. tostring(reply and reply.err and reply.err.message or 'timeout'))
    return
  end
  local models = ('%s%s on %s (%s), drafter %s'):format(
    stats.target or '?',
    stats.draft and (' + ' .. stats.draft) or '',
    stats.device or '?',
    stats.dtype or '?',
    stats.drafter or '?'
  )
  if stats.state == 'ready' then
    h.ok('models ready: ' .. models)
  elseif stats.state == 'loading' or stats.state == 'idle' then
    -- idle: not loading yet (a reload between unloading the old models and loading the new ones)
    h.info('models loading: ' .. models)
  else
    h.error('models failed to load: ' .. tostring(stats.error))
  end

  local accept = draftwise.config.keymaps and draftwise.config.keymaps.accept
  if accept then
    local map = vim.fn.maparg(accept, 'i', false, true)
    if type(map) == 'table' and map.desc == 'draftwise' then
      h.ok(accept .. ' accepts a suggestion in insert mode')
    else
      h.warn(accept .. ' was mapped again after setup; it no longer accepts suggestions')
    end
  end
end

return M
