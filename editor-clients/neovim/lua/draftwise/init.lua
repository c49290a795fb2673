-- Draftwise for Neovim: starts the draftwise language server, passes settings, shows its inline
-- suggestions as ghost text and its state. The server does the work; this stays thin.
local compat = require('draftwise.compat')

local M = {}

local NAME = 'draftwise'
local STATS_REQUEST = 'draftwise/stats'

---@class draftwise.Keymaps
---@field accept string|false      accept the whole suggestion (falls through when none is shown)
---@field accept_line string|false accept up to the end of the suggestion's first line
---@field dismiss string|false
---@field trigger string|false     ask for a suggestion now

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
    device = nil, ---@type string?  "auto" | "cpu" | "cuda" | "cuda:N" | "mps"
    dtype = nil, ---@type string?
    temperature = nil, ---@type number?
    contextTokens = nil, ---@type integer?
    languages = nil, ---@type string[]?
    scope = nil, ---@type string?   "auto" | "line" | "block" | "full"
  },
  filetypes = nil, ---@type string[]? nil: every buffer that holds a file
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'Cargo.toml', 'go.mod' },
  -- "auto": vim.lsp.inline_completion on Neovim 0.12+, the plugin's own ghost text before that.
  native = 'auto', ---@type "auto"|boolean
  auto_trigger = true,
  debounce_ms = 150,
  keymaps = {
    accept = '<Tab>',
    accept_line = '<M-l>',
    dismiss = '<C-]>',
    trigger = '<M-\\>',
  },
  highlight = 'DraftwiseSuggestion', -- linked to Comment unless already defined
}

M.config = vim.deepcopy(defaults)
M.state = {
  setup_done = false,
  client_id = nil, ---@type integer?
  progress = nil, ---@type {message: string?, percentage: number?}?
  stats = nil, ---@type table? last draftwise/stats reply
  error = nil, ---@type string?
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
  if M.config.native == 'auto' then
    return vim.lsp.inline_completion ~= nil
  end
  return M.config.native == true
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
    M.state.stats = compat.strip_nulls(result)
    if M.state.stats and M.state.stats.state ~= 'loading' then
      M.state.progress = nil
    end
    redraw_status()
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

-- Polls until the models are loaded or failed; covers a server that sends no progress.
local function poll_until_settled()
  stop_polling()
  poll_timer = compat.uv.new_timer()
  poll_timer:start(0, 1500, vim.schedule_wrap(function()
    M.get_stats(function(stats)
      if stats and stats.state ~= 'loading' then
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

--- One short line for a statusline: loading progress, ready with the last suggestion's numbers, or the error.
function M.status()
  if M.state.error then
    return 'draftwise: error'
  end
  if not M.client() then
    return ''
  end
  local stats = M.state.stats
  if M.state.progress or not stats or stats.state == 'loading' then
    local p = M.state.progress and M.state.progress.percentage
    return p and ('draftwise: loading %d%%'):format(p) or 'draftwise: loading'
  end
  if stats.state == 'failed' then
    return 'draftwise: error'
  end
  local last = stats.last
  if last then
    return ('draftwise: %s accepted, %.2f tok/fwd'):format(
      percent(last.acceptance_rate),
      tonumber(last.tokens_per_forward) or 0
    )
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
    ('requests: %s'):format(stats.requests or 0),
  }
  if stats.last then
    table.insert(lines, ('last:     %s of drafted tokens accepted, %.2f tokens per target forward'):format(
      percent(stats.last.acceptance_rate),
      tonumber(stats.last.tokens_per_forward) or 0
    ))
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
    M.get_stats()
  else
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
    on_init = function(client)
      M.state.client_id = client.id
      M.state.stats = nil
      poll_until_settled()
    end,
    on_exit = function(code, signal, client_id)
      if client_id ~= M.state.client_id then
        return
      end
      vim.schedule(function()
        stop_polling()
        M.state.client_id = nil
        M.state.progress = nil
        if code ~= 0 and signal ~= 15 then
          M.state.error = ('the server exited (code %s, signal %s)'):format(code, signal)
        end
        redraw_status()
      end)
    end,
    on_attach = function(client, buf)
      if use_native() then
        vim.lsp.inline_completion.enable(true, { bufnr = buf })
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

function M.restart()
  local client = M.client()
  local buffers = {}
  if client then
    for buf in pairs(client.attached_buffers or {}) do
      table.insert(buffers, buf)
    end
    compat.stop(client)
  end
  M.state.client_id = nil
  M.state.stats = nil
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
  if use_native() then
    if keys.accept then
      local fallback = make_fallback(keys.accept)
      vim.keymap.set('i', keys.accept, function()
        if not vim.lsp.inline_completion.get() then
          fallback()
        end
      end, { desc = 'draftwise' })
    end
    return
  end
  local ghost = require('draftwise.ghost')
  if keys.accept then
    local fallback = make_fallback(keys.accept)
    vim.keymap.set('i', keys.accept, function()
      if not ghost.accept() then
        fallback()
      end
    end, { desc = 'draftwise' })
  end
  if keys.accept_line then
    local fallback = make_fallback(keys.accept_line)
    vim.keymap.set('i', keys.accept_line, function()
      if not ghost.accept_line() then
        fallback()
      end
    end, { desc = 'draftwise' })
  end
  if keys.dismiss then
    local fallback = make_fallback(keys.dismiss)
    vim.keymap.set('i', keys.dismiss, function()
      if not ghost.dismiss() then
        fallback()
      end
    end, { desc = 'draftwise' })
  end
  if keys.trigger then
    vim.keymap.set('i', keys.trigger, function()
      ghost.trigger(nil, 1)
    end, { desc = 'draftwise' })
  end
end

-- Setup -----------------------------------------------------------------------------------------

---@param opts draftwise.Config?
function M.setup(opts)
  opts = opts or {}
  for key, kind in pairs({ cmd = 'table', cmd_env = 'table', settings = 'table', filetypes = 'table',
    keymaps = 'table', debounce_ms = 'number', auto_trigger = 'boolean', root_markers = 'table' }) do
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
