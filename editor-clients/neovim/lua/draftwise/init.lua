-- Draftwise for Neovim: starts the draftwise language server, passes settings, shows its inline
-- suggestions as ghost text and its state. The server does the work; this stays thin.
local compat = require('draftwise.compat')

local M = {}

local NAME = 'draftwise'
local STATS_REQUEST = 'draftwise/stats'

---@class draftwise.Keymaps
---@field accept string|false      accept the whole suggestion (falls through when none is shown)
---@field accept_line string|false accept up to the end of the suggestion's first line
---@field accept_word string|false accept the suggestion's next word
---@field next string|false        show the next alternative (after an explicit trigger)
---@field prev string|false        show the previous alternative
---@field dismiss string|false
---@field trigger string|false     ask for a suggestion now (with alternatives)

---@class draftwise.Config
local defaults = {
  -- Server command; nil: `.venv/bin/draftwise serve` (or venv/) under the root, else `draftwise serve` on PATH.
  cmd = nil, ---@type string[]?
  cmd_env = nil, ---@type table<string, string>?
  -- Sent as initializationOptions and workspace/didChangeConfiguration; nil values keep the
  -- server's defaults (or its command-line flags).
  settings = {
    target = nil, ---@type string?  preset, Hugging Face directory, .gguf file or hub id
    draft = nil, ---@type string?   draft model spec, or "none"
    drafter = nil, ---@type string? "auto" | "none" | "lookup" | "model" | "suggestion"
    maxTokens = nil, ---@type integer?
    maxTimeMs = nil, ---@type integer? generation time cap per suggestion (server default 150; 0: none)
    device = nil, ---@type string?  "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
    dtype = nil, ---@type string?
    temperature = nil, ---@type number?
    contextTokens = nil, ---@type integer?
    languages = nil, ---@type string[]?
    scope = nil, ---@type string?   "auto" | "line" | "block" | "full"
    alternatives = nil, ---@type integer? most items for an explicit trigger (server default 3)
    repoContext = nil, ---@type boolean? the repository as context (server default false)
    repoContextTokens = nil, ---@type integer? its share of the prompt budget (server default 512)
  },
  filetypes = nil, ---@type string[]? nil: every buffer that holds a file
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod' },
  -- false: the plugin's own ghost text on every version (the default: every key and the statusline
  -- work the same everywhere). true (or "auto" on 0.12+): Neovim's vim.lsp.inline_completion shows
  -- the suggestions, with the plugin's keys on top of it (see native.lua for what that leaves out).
  native = false, ---@type "auto"|boolean
  auto_trigger = true,
  -- From the last change to the request (copilot.lua's default). Short: typing along a shown
  -- suggestion keeps it on screen meanwhile, and the server answers a request it has prepared at once.
  debounce_ms = 75,
  keymaps = {
    accept = '<Tab>',
    accept_line = '<M-l>',
    accept_word = '<M-Right>',
    next = '<M-]>',
    prev = '<M-[>',
    dismiss = '<C-]>',
    trigger = '<M-\\>',
  },
  highlight = 'DraftwiseSuggestion', -- linked to Comment unless already defined
  -- The last suggestion's latency and speed after the ghost text too (like llama.vim); the
  -- statusline always has them.
  show_timing_inline = false,
  -- A server that exits on its own is started again, at most `max` times within `window_s` seconds.
  restart = { max = 3, window_s = 60 },
}

M.config = vim.deepcopy(defaults)
M.state = {
  setup_done = false,
  client_id = nil, ---@type integer?
  progress = nil, ---@type {message: string?, percentage: number?}?
  stats = nil, ---@type table? last draftwise/stats reply
  -- Whether the server last said its models are ready (progress or stats); when it turns true, a
  -- request that got nothing while they loaded is asked again.
  ready = false,
  error = nil, ---@type string?
  generating = false, -- a suggestion request is in flight
  disabled = false, -- :DraftwiseDisable (everywhere)
  disabled_filetypes = {}, ---@type table<string, boolean>
  snoozed_until = nil, ---@type number? os.time() when suggestions come back
  restarts = {}, ---@type number[] when the server was restarted after exiting on its own
}

local augroup = nil

local function is_executable(path)
  return path ~= nil and vim.fn.executable(path) == 1
end

--- Root directory for a buffer: the nearest marker above its file, else the working directory.
function M.root_dir(bufnr)
  local name = vim.api.nvim_buf_get_name(bufnr)
  local start = name ~= '' and vim.fs.dirname(name) or vim.fn.getcwd()
  local found = vim.fs.find(M.config.root_markers, { path = start, upward = true })[1]
  return found and vim.fs.dirname(found) or vim.fn.getcwd()
end

--- The command that starts the server, or nil and why not.
---@return string[]?, string?
function M.server_cmd(root)
  if M.config.cmd then
    local exe = M.config.cmd[1]
    if not is_executable(exe) then
      return nil, ('cmd[1] = %q is not executable'):format(tostring(exe))
    end
    return M.config.cmd
  end
  local sep = package.config:sub(1, 1)
  local bin = sep == '\\' and 'Scripts' or 'bin'
  for _, dir in ipairs({ root, vim.fn.getcwd() }) do
    for _, venv in ipairs({ '.venv', 'venv' }) do
      local candidate = table.concat({ dir, venv, bin, 'draftwise' }, sep)
      if is_executable(candidate) then
        return { candidate, 'serve' }
      end
    end
  end
  if is_executable('draftwise') then
    return { vim.fn.exepath('draftwise'), 'serve' }
  end
  return nil, 'draftwise not found in .venv/ or venv/ under ' .. root .. ' nor on PATH; set cmd in setup{}'
end

--- Settings as the server reads them (nil entries dropped).
function M.server_settings()
  local out = {}
  for key, value in pairs(M.config.settings or {}) do
    if value ~= nil then
      out[key] = value
    end
  end
  return out
end

---@return vim.lsp.Client?
function M.client()
  local id = M.state.client_id
  local client = id and vim.lsp.get_client_by_id(id)
  if client and not compat.is_stopped(client) then
    return client
  end
  return nil
end

local function use_native()
  -- Only where Neovim has it (0.12+); elsewhere the plugin's own path serves either way.
  return (M.config.native == 'auto' or M.config.native == true) and vim.lsp.inline_completion ~= nil
end

local function redraw_status()
  pcall(vim.cmd.redrawstatus)
  pcall(vim.api.nvim_exec_autocmds, 'User', { pattern = 'DraftwiseStatus', modeline = false })
end

-- Stats -----------------------------------------------------------------------------------------

local poll_timer = nil

--- Asks the server for its stats; cb(stats?, err?) on the main loop.
function M.get_stats(cb)
  local client = M.client()
  if not client then
    if cb then
      cb(nil, M.state.error or 'the draftwise server is not running')
    end
    return
  end
  compat.request(client, STATS_REQUEST, {}, function(err, result)
    if err then
      if cb then
        cb(nil, err.message or tostring(err))
      end
      return
    end
    if client.id ~= M.state.client_id then
      if cb then
        cb(nil, 'the server was restarted meanwhile')
      end
      return
    end
    M.state.stats = compat.strip_nulls(result)
    if M.state.stats and M.state.stats.state ~= 'loading' and M.state.stats.state ~= 'idle' then
      M.state.progress = nil
    end
    if M.state.stats and M.state.stats.state == 'ready' then
      M.state.error = nil
    end
    local was_ready = M.state.ready
    M.state.ready = M.state.stats ~= nil and M.state.stats.state == 'ready'
    if M.state.ready and not was_ready and not use_native() then
      require('draftwise.ghost').ask_again_after_load()
    end
    redraw_status()
    if M.config.show_timing_inline then
      require('draftwise.ghost').redraw()
    end
    if cb then
      cb(M.state.stats)
    end
  end)
end

local function stop_polling()
  if poll_timer then
    poll_timer:stop()
    if not poll_timer:is_closing() then
      poll_timer:close()
    end
    poll_timer = nil
  end
end

-- Polls until the models are loaded or failed; covers a server that sends no progress. ("idle":
-- no models yet, e.g. a reload between unloading the old ones and loading the new ones.)
local function poll_until_settled()
  stop_polling()
  poll_timer = compat.uv.new_timer()
  poll_timer:start(0, 1500, vim.schedule_wrap(function()
    M.get_stats(function(stats)
      if stats and stats.state ~= 'loading' and stats.state ~= 'idle' then
        stop_polling()
      end
    end)
  end))
end

local refresh_timer = nil
--- Refreshes stats shortly after a suggestion or an accept (coalesced).
function M.refresh_stats_soon()
  if not refresh_timer then
    refresh_timer = compat.uv.new_timer()
  end
  refresh_timer:stop()
  refresh_timer:start(300, 0, vim.schedule_wrap(function()
    M.get_stats()
  end))
end

local function percent(value)
  return type(value) == 'number' and ('%d%%'):format(math.floor(value * 100 + 0.5)) or '-'
end

-- On/off ----------------------------------------------------------------------------------------

--- Whether suggestions are on for bufnr, and if not, why ("buffer", "filetype", "everywhere",
--- "snoozed"). b:draftwise_enabled = false turns a buffer off, like b:copilot_enabled.
---@return boolean, string?
function M.is_enabled(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  if M.state.snoozed_until then
    if os.time() < M.state.snoozed_until then
      return false, 'snoozed'
    end
    M.state.snoozed_until = nil
  end
  if M.state.disabled then
    return false, 'everywhere'
  end
  if vim.api.nvim_buf_is_valid(bufnr) then
    if M.state.disabled_filetypes[vim.bo[bufnr].filetype] then
      return false, 'filetype'
    end
    if vim.b[bufnr].draftwise_enabled == false then
      return false, 'buffer'
    end
  end
  return true
end

local SCOPES = { buffer = true, filetype = true, global = true }

local function check_scope(scope)
  scope = scope or 'global'
  if scope == 'language' then
    scope = 'filetype'
  end
  if not SCOPES[scope] then
    error(('draftwise: scope must be buffer, filetype (or language) or global; got %q'):format(tostring(scope)), 0)
  end
  return scope
end

local function set_enabled(on, scope, bufnr)
  scope = check_scope(scope)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  if scope == 'global' then
    M.state.disabled = not on
    if on then
      M.state.snoozed_until = nil
    end
  elseif scope == 'filetype' then
    M.state.disabled_filetypes[vim.bo[bufnr].filetype] = (not on) or nil
  else
    vim.b[bufnr].draftwise_enabled = on
  end
  if not on then
    for _, buf in ipairs(vim.api.nvim_list_bufs()) do
      if not M.is_enabled(buf) then
        require('draftwise.ghost').clear(buf)
      end
    end
  end
  if use_native() then
    require('draftwise.native').sync_enabled()
  end
  redraw_status()
end

--- Turns suggestions on for the buffer, its filetype ("language") or everywhere (the default).
function M.enable(scope, bufnr)
  set_enabled(true, scope, bufnr)
end

--- Turns suggestions off for the buffer, its filetype ("language") or everywhere (the default).
--- The server keeps running (and keeps its models loaded).
function M.disable(scope, bufnr)
  set_enabled(false, scope, bufnr)
end

function M.toggle(scope, bufnr)
  scope = check_scope(scope)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local on
  if scope == 'global' then
    on = M.state.disabled or M.state.snoozed_until ~= nil
  elseif scope == 'filetype' then
    on = M.state.disabled_filetypes[vim.bo[bufnr].filetype] == true
  else
    on = vim.b[bufnr].draftwise_enabled == false
  end
  set_enabled(on, scope, bufnr)
end

local snooze_timer = nil
--- No suggestions anywhere for `minutes` (default 15); they come back by themselves.
function M.snooze(minutes)
  minutes = tonumber(minutes or 15)
  if not minutes or minutes <= 0 then
    error('draftwise: snooze needs a positive number of minutes', 0)
  end
  M.state.snoozed_until = os.time() + math.floor(minutes * 60 + 0.5)
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    require('draftwise.ghost').clear(buf)
  end
  if snooze_timer then
    snooze_timer:stop()
  else
    snooze_timer = compat.uv.new_timer()
  end
  -- Redraws the statusline when the snooze ends (is_enabled clears it then).
  snooze_timer:start(math.floor(minutes * 60000), 0, vim.schedule_wrap(function()
    if use_native() then
      require('draftwise.native').sync_enabled()
    end
    redraw_status()
  end))
  if use_native() then
    require('draftwise.native').sync_enabled()
  end
  redraw_status()
end

-- Statusline ------------------------------------------------------------------------------------

--- A request is (no longer) in flight: "generating…" in the statusline.
function M.generating(on)
  if M.state.generating ~= on then
    M.state.generating = on
    redraw_status()
  end
end

--- "123 ms, 45.6 tok/s" for the last suggestion (server's numbers), or nil before the first one.
function M.timing_text()
  local timing = M.state.stats and M.state.stats.timing
  if type(timing) ~= 'table' or type(timing.latencyMs) ~= 'number' then
    return nil
  end
  local speed = type(timing.tokensPerSecond) == 'number' and (', %.1f tok/s'):format(timing.tokensPerSecond) or ''
  return ('%d ms%s'):format(math.floor(timing.latencyMs + 0.5), speed)
end

--- One short line for a statusline: loading progress, off/snoozed, generating, the last
--- suggestion's latency, speed and acceptance, or the error.
function M.status()
  if M.state.error then
    return 'draftwise: error'
  end
  if not M.client() then
    return ''
  end
  local on, why = M.is_enabled(vim.api.nvim_get_current_buf())
  if not on then
    if why == 'snoozed' then
      return ('draftwise: snoozed %d min'):format(math.ceil((M.state.snoozed_until - os.time()) / 60))
    end
    return ('draftwise: off (%s)'):format(why)
  end
  local stats = M.state.stats
  if M.state.progress or not stats or stats.state == 'loading' or stats.state == 'idle' then
    local p = M.state.progress and M.state.progress.percentage
    return p and ('draftwise: loading %d%%'):format(p) or 'draftwise: loading'
  end
  if stats.state == 'failed' then
    return 'draftwise: error'
  end
  if M.state.generating then
    return 'draftwise: generating…'
  end
  -- The numbers of the suggestion last shown (an answer from idle work's suggestion included).
  local timing = M.timing_text()
  if timing then
    return ('draftwise: %s, %s accepted'):format(timing, percent(stats.timing.acceptanceRate))
  end
  return 'draftwise: ready'
end

--- Lines describing stats for :DraftwiseStats.
function M.format_stats(stats)
  local lines = {
    ('state:    %s%s'):format(stats.state or '?', stats.error and (' (' .. stats.error .. ')') or ''),
    ('target:   %s'):format(stats.target or '?'),
    ('draft:    %s'):format(stats.draft or 'none'),
    ('drafter:  %s'):format(stats.drafter or '?'),
    ('device:   %s, %s'):format(stats.device or '?', stats.dtype or '?'),
    ('weights:  %s%s'):format(stats.weights or '?', stats.weightsReason and (' (' .. stats.weightsReason .. ')') or ''),
    ('requests: %s'):format(stats.requests or 0),
  }
  if stats.last then
    table.insert(lines, ('last:     %s of drafted tokens accepted, %.2f tokens per target forward'):format(
      percent(stats.last.acceptance_rate),
      tonumber(stats.last.tokens_per_forward) or 0
    ))
  end
  local timing = M.timing_text()
  if timing then
    table.insert(lines, ('timing:   %s'):format(timing))
  end
  if stats.suggestions then
    local sg = stats.suggestions
    table.insert(lines, ('items:    %s shown, %s accepted, %s partly accepted, %s alternatives shown'):format(
      sg.shown or 0, sg.accepted or 0, sg.partiallyAccepted or 0, sg.alternativesShown or 0))
  end
  table.insert(lines, '')
  for _, line in ipairs(vim.split(vim.inspect({ last = stats.last, cumulative = stats.cumulative }), '\n')) do
    table.insert(lines, line)
  end
  return lines
end

function M.show_stats()
  M.get_stats(function(stats, err)
    if not stats then
      vim.notify('draftwise: ' .. tostring(err), vim.log.levels.WARN)
      return
    end
    local lines = M.format_stats(stats)
    local buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
    vim.bo[buf].modifiable = false
    vim.bo[buf].bufhidden = 'wipe'
    local width = 20
    for _, line in ipairs(lines) do
      width = math.max(width, vim.fn.strdisplaywidth(line))
    end
    width = math.min(width + 2, vim.o.columns - 4)
    local height = math.min(#lines, vim.o.lines - 4)
    local win_opts = {
      relative = 'editor',
      row = math.floor((vim.o.lines - height) / 2),
      col = math.floor((vim.o.columns - width) / 2),
      width = width,
      height = height,
      style = 'minimal',
      border = 'rounded',
    }
    if compat.has('0.9') then
      win_opts.title = ' Draftwise stats '
    end
    local win = vim.api.nvim_open_win(buf, true, win_opts)
    vim.keymap.set('n', 'q', function()
      pcall(vim.api.nvim_win_close, win, true)
    end, { buffer = buf, nowait = true })
  end)
end

-- Client ----------------------------------------------------------------------------------------

local function capabilities()
  local caps = vim.lsp.protocol.make_client_capabilities()
  caps.textDocument = caps.textDocument or {}
  -- 0.11 does not announce inline completion itself; the plugin's own client handles it.
  caps.textDocument.inlineCompletion = caps.textDocument.inlineCompletion or { dynamicRegistration = false }
  return caps
end

local function on_progress(client_id, params)
  if client_id ~= M.state.client_id or type(params) ~= 'table' or type(params.value) ~= 'table' then
    return
  end
  local value = params.value
  if value.kind == 'end' then
    M.state.progress = nil
    -- The stats say whether the load ended ready (and then the plugin asks again).
    M.get_stats()
  else
    M.state.ready = false
    M.state.progress = {
      message = value.message or value.title or (M.state.progress and M.state.progress.message),
      percentage = value.percentage or (M.state.progress and M.state.progress.percentage),
    }
  end
  redraw_status()
end

--- Starts the server (once per Neovim) and attaches it to bufnr.
function M.attach(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  if vim.bo[bufnr].buftype ~= '' then
    return
  end
  -- The empty buffer Neovim starts with is no reason to load models.
  if vim.api.nvim_buf_get_name(bufnr) == '' and vim.bo[bufnr].filetype == '' then
    return
  end
  local fts = M.config.filetypes
  if fts and not vim.tbl_contains(fts, vim.bo[bufnr].filetype) then
    return
  end
  local root = M.root_dir(bufnr)
  local cmd, why = M.server_cmd(root)
  if not cmd then
    if M.state.error ~= why then
      M.state.error = why
      vim.notify('draftwise: ' .. why, vim.log.levels.ERROR)
    end
    return
  end
  M.state.error = nil
  local settings = M.server_settings()
  local id = vim.lsp.start({
    name = NAME,
    cmd = cmd,
    cmd_env = M.config.cmd_env,
    root_dir = root,
    init_options = settings,
    settings = { draftwise = settings },
    capabilities = capabilities(),
    -- Every change at once (Neovim holds them 150 ms by default, until a request flushes them): the
    -- server starts on the suggestion right after a keystroke, before the plugin asks (idle work).
    flags = { debounce_text_changes = 0 },
    on_init = function(client)
      M.state.client_id = client.id
      M.state.stats = nil
      M.state.ready = false
      poll_until_settled()
    end,
    on_exit = function(code, signal, client_id)
      if client_id ~= M.state.client_id then
        return
      end
      local client = vim.lsp.get_client_by_id(client_id)
      local buffers = {}
      for buf in pairs(client and client.attached_buffers or {}) do
        table.insert(buffers, buf)
      end
      vim.schedule(function()
        stop_polling()
        M.state.client_id = nil
        M.state.progress = nil
        M.state.ready = false
        M.state.generating = false
        -- (:DraftwiseRestart forgets the client first, so its stop never gets here.)
        local leaving = vim.v.exiting ~= vim.NIL
        if not leaving and (code ~= 0 or signal ~= 0) and signal ~= 15 then
          M.state.error = ('the server exited (code %s, signal %s)'):format(code, signal)
          M.restart_after_crash(buffers)
        end
        redraw_status()
      end)
    end,
    on_attach = function(client, buf)
      if use_native() then
        require('draftwise.native').attach(buf, client)
      else
        require('draftwise.ghost').attach(buf, client)
      end
    end,
  }, {
    bufnr = bufnr,
    -- One server for the whole editor: each one holds the models in memory.
    reuse_client = function(client, config)
      return client.name == config.name
    end,
  })
  if id and not M.state.client_id then
    M.state.client_id = id
  end
  return id
end

--- Sends new settings to the running server (and keeps them for the next start).
function M.update_settings(settings)
  M.config.settings = vim.tbl_extend('force', M.config.settings or {}, settings or {})
  local client = M.client()
  if client then
    client.settings = { draftwise = M.server_settings() }
    compat.notify(client, 'workspace/didChangeConfiguration', { settings = client.settings })
    poll_until_settled()
  end
end

--- After the server exited on its own: start it again for `buffers`, at most restart.max times in
--- restart.window_s seconds, waiting a little longer each time; then give up and say so.
function M.restart_after_crash(buffers)
  local policy = M.config.restart or {}
  local max, window = policy.max or 3, policy.window_s or 60
  local now = compat.uv.now() / 1000
  local recent = {}
  for _, t in ipairs(M.state.restarts) do
    if now - t < window then
      table.insert(recent, t)
    end
  end
  M.state.restarts = recent
  if #recent >= max then
    M.state.error = ('%s; not restarted: it exited %d times within %d s (:DraftwiseRestart tries again)'):format(
      M.state.error or 'the server exited', #recent + 1, window)
    vim.notify('draftwise: ' .. M.state.error, vim.log.levels.ERROR)
    return
  end
  table.insert(M.state.restarts, now)
  local attempt = #M.state.restarts
  vim.notify(('draftwise: %s; restarting it (%d of %d)'):format(M.state.error, attempt, max), vim.log.levels.WARN)
  vim.defer_fn(function()
    if M.client() then
      return
    end
    M.state.error = nil
    local started = false
    for _, buf in ipairs(buffers) do
      if vim.api.nvim_buf_is_valid(buf) and M.attach(buf) then
        started = true
      end
    end
    if not started then
      M.attach(vim.api.nvim_get_current_buf())
    end
  end, 300 * attempt)
end

function M.restart()
  local client = M.client()
  local buffers = {}
  M.state.restarts = {}
  if client then
    for buf in pairs(client.attached_buffers or {}) do
      table.insert(buffers, buf)
    end
    compat.stop(client)
  end
  M.state.client_id = nil
  M.state.stats = nil
  M.state.ready = false
  M.state.error = nil
  vim.defer_fn(function()
    for _, buf in ipairs(buffers) do
      if vim.api.nvim_buf_is_valid(buf) then
        M.attach(buf)
      end
    end
    if #buffers == 0 then
      M.attach(vim.api.nvim_get_current_buf())
    end
  end, 500)
end

-- Keymaps ---------------------------------------------------------------------------------------

local function termcodes(keys)
  return vim.api.nvim_replace_termcodes(keys, true, false, true)
end

-- Runs whatever the key did before the plugin mapped it (another mapping or the key itself).
local function make_fallback(lhs)
  local previous = vim.fn.maparg(lhs, 'i', false, true)
  if type(previous) ~= 'table' or vim.tbl_isempty(previous) or previous.desc == 'draftwise' then
    return function()
      vim.api.nvim_feedkeys(termcodes(lhs), 'in', false)
    end
  end
  local mode = previous.noremap == 1 and 'in' or 'im'
  return function()
    local keys
    if previous.callback then
      keys = previous.callback()
      if previous.expr ~= 1 then
        return
      end
    elseif previous.expr == 1 then
      keys = vim.api.nvim_eval(previous.rhs)
    else
      keys = previous.rhs
    end
    if type(keys) == 'string' and keys ~= '' then
      vim.api.nvim_feedkeys(previous.replace_keycodes == 0 and keys or termcodes(keys), mode, false)
    end
  end
end

local function set_keymaps()
  local keys = M.config.keymaps or {}
  -- Own path and native path offer the same actions (native.lua maps them onto Neovim's API).
  local actions = use_native() and require('draftwise.native') or require('draftwise.ghost')
  -- Each key does its thing when a suggestion is shown and falls through to what it did before
  -- otherwise.
  for name, action in pairs({
    accept = actions.accept,
    accept_line = actions.accept_line,
    accept_word = actions.accept_word,
    next = function()
      return actions.cycle(1)
    end,
    prev = function()
      return actions.cycle(-1)
    end,
    dismiss = actions.dismiss,
  }) do
    local lhs = keys[name]
    if lhs then
      local fallback = make_fallback(lhs)
      vim.keymap.set('i', lhs, function()
        if not action() then
          fallback()
        end
      end, { desc = 'draftwise' })
    end
  end
  if keys.trigger then
    vim.keymap.set('i', keys.trigger, function()
      actions.trigger(nil, 1)
    end, { desc = 'draftwise' })
  end
end

-- Setup -----------------------------------------------------------------------------------------

---@param opts draftwise.Config?
function M.setup(opts)
  opts = opts or {}
  for key, kind in pairs({ cmd = 'table', cmd_env = 'table', settings = 'table', filetypes = 'table',
    keymaps = 'table', debounce_ms = 'number', auto_trigger = 'boolean', root_markers = 'table',
    show_timing_inline = 'boolean', restart = 'table' }) do
    if opts[key] ~= nil and type(opts[key]) ~= kind then
      error(('draftwise.setup: %s must be a %s, got %s'):format(key, kind, type(opts[key])), 2)
    end
  end
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(defaults), opts)
  if opts.settings then
    -- Keep nil-valued defaults out and take the user's table as given.
    M.config.settings = vim.deepcopy(opts.settings)
  end
  -- default = true: a colorscheme's or the user's own definition wins.
  vim.api.nvim_set_hl(0, M.config.highlight, { link = 'Comment', default = true })
  vim.api.nvim_set_hl(0, 'DraftwiseHint', { link = 'NonText', default = true })

  augroup = vim.api.nvim_create_augroup('draftwise', { clear = true })
  vim.api.nvim_create_autocmd({ 'FileType', 'BufEnter' }, {
    group = augroup,
    callback = function(ev)
      local client = M.client()
      if client and vim.lsp.buf_is_attached(ev.buf, client.id) then
        return
      end
      M.attach(ev.buf)
    end,
  })
  if compat.has('0.10') then
    vim.api.nvim_create_autocmd('LspProgress', {
      group = augroup,
      callback = function(ev)
        on_progress(ev.data and ev.data.client_id, ev.data and ev.data.params)
      end,
    })
  else
    -- 0.8 - 0.9: progress lands in client.messages; only the percentage is read from there.
    vim.api.nvim_create_autocmd('User', {
      group = augroup,
      pattern = 'LspProgressUpdate',
      callback = function()
        local client = M.client()
        local progress = client and client.messages and client.messages.progress or {}
        for _, p in pairs(progress) do
          on_progress(M.state.client_id, {
            value = { kind = p.done and 'end' or 'report', message = p.message, percentage = p.percentage },
          })
        end
      end,
    })
  end

  vim.api.nvim_create_user_command('DraftwiseStats', M.show_stats, { desc = 'Show the draftwise server stats' })
  vim.api.nvim_create_user_command('DraftwiseRestart', M.restart, { desc = 'Restart the draftwise server' })
  local function scope_command(fn)
    return function(opts)
      local ok, err = pcall(fn, opts.args ~= '' and opts.args or nil)
      if not ok then
        vim.notify(tostring(err), vim.log.levels.ERROR)
      end
    end
  end
  local scope_opts = {
    nargs = '?',
    complete = function()
      return { 'buffer', 'language', 'global' }
    end,
  }
  vim.api.nvim_create_user_command('DraftwiseEnable', scope_command(M.enable),
    vim.tbl_extend('force', scope_opts, { desc = 'Suggestions on: buffer, language or global (default)' }))
  vim.api.nvim_create_user_command('DraftwiseDisable', scope_command(M.disable),
    vim.tbl_extend('force', scope_opts, { desc = 'Suggestions off: buffer, language or global (default)' }))
  vim.api.nvim_create_user_command('DraftwiseToggle', scope_command(M.toggle),
    vim.tbl_extend('force', scope_opts, { desc = 'Suggestions on/off: buffer, language or global (default)' }))
  vim.api.nvim_create_user_command('DraftwiseSnooze', scope_command(M.snooze),
    { nargs = '?', desc = 'No suggestions for N minutes (default 15)' })
  set_keymaps()
  M.state.setup_done = true

  -- Buffers already open when setup runs (e.g. lazy-loaded plugin).
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(buf) and vim.api.nvim_buf_get_name(buf) ~= '' then
      M.attach(buf)
    end
  end
end

M._use_native = use_native

return M
