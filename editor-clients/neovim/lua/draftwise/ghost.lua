-- The plugin's own inline suggestions (every Neovim version; 0.12's vim.lsp.inline_completion is
-- used only when asked for, see native.lua): requests textDocument/inlineCompletion after a pause in
-- typing, draws the suggestion as ghost text with extmarks, keeps it on screen while the user types
-- along it, drops replies that no longer match the buffer, cycles the items of an invoked request,
-- and accepts all of it, a word, or a line (partial accepts are reported to the server).
local compat = require('draftwise.compat')

local M = {}

local ns = vim.api.nvim_create_namespace('draftwise_ghost')
local TRIGGER_INVOKED, TRIGGER_AUTOMATIC = 1, 2

---@class draftwise.Suggestion
---@field bufnr integer
---@field client_id integer
---@field row integer      0-based cursor row when shown
---@field col integer      byte column of the cursor when shown
---@field tick integer     changedtick when shown
---@field insert string    full text the item inserts over [start_col, end_col)
---@field start_col integer
---@field end_col integer
---@field ghost string     the part not yet typed (what is drawn)
---@field line string      the cursor's line when drawn
---@field command table?   the item's command, run after accepting
---@field extmark integer
---@field items table[]    every item of the reply (an invoked request may bring several)
---@field index integer    which of them is shown

---@type table<integer, {timer: uv.uv_timer_t?, seq: integer, pending: {client: vim.lsp.Client, id: integer}?, suggestion: draftwise.Suggestion?, group: integer, unanswered: {row: integer, col: integer, tick: integer, kind: integer}?}>
local buffers = {}

local function draftwise()
  return require('draftwise')
end

local function snippet_text(value)
  -- Plain text of a snippet: placeholders keep their default text, tab stops vanish.
  local text = value:gsub('%${%d+:([^}]*)}', '%1'):gsub('%$%d+', ''):gsub('\\([$}\\])', '%1')
  return text
end

local function item_text(item)
  local text = item.insertText
  if type(text) == 'table' then
    return text.kind == 'snippet' and snippet_text(text.value or '') or (text.value or '')
  end
  return text or ''
end

local function clear_extmark(state)
  local s = state.suggestion
  if s and vim.api.nvim_buf_is_valid(s.bufnr) then
    pcall(vim.api.nvim_buf_del_extmark, s.bufnr, ns, s.extmark)
  end
  state.suggestion = nil
end

--- Whether any buffer waits for a reply ("generating…" in the statusline).
local function any_pending()
  for _, state in pairs(buffers) do
    if state.pending then
      return true
    end
  end
  return false
end

local function set_pending(state, pending)
  state.pending = pending
  draftwise().generating(any_pending())
end

local function cancel_pending(state)
  if state.pending then
    pcall(compat.cancel_request, state.pending.client, state.pending.id)
    set_pending(state, nil)
  end
end

--- Stops the debounce timer and any request in flight (a reply that comes anyway is dropped).
local function stop(state)
  state.seq = state.seq + 1
  if state.timer then
    state.timer:stop()
  end
  cancel_pending(state)
end

--- Removes the suggestion and cancels any request in flight.
function M.clear(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  stop(state)
  clear_extmark(state)
end

local function in_insert_mode()
  local mode = vim.api.nvim_get_mode().mode
  return mode:sub(1, 1) == 'i' or mode:sub(1, 1) == 'R'
end

local function cursor()
  local pos = vim.api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2]
end

--- The suggestion `insert`, which replaces bytes [start_col, end_col) of `line` (line `row`), seen
--- from the cursor at `col`: nil when what is typed there no longer begins it, or nothing is left.
---@return draftwise.Suggestion?
local function fit(bufnr, row, line, col, tick, insert, start_col, end_col)
  local typed = line:sub(start_col + 1, col)
  if insert:sub(1, #typed) ~= typed then
    return nil -- the suggestion no longer continues what is typed
  end
  local ghost = insert:sub(#typed + 1)
  -- Text after the cursor that the item replaces (auto-closed brackets) and repeats at its end must
  -- show once: on one line the buffer's copy stands for it; over several lines the copy at the end
  -- of the suggestion is the right one, so the buffer's is covered (see draw).
  local replaced = line:sub(col + 1, end_col)
  local cover = 0
  if replaced ~= '' and ghost:sub(-#replaced) == replaced then
    if ghost:find('\n', 1, true) then
      cover = vim.fn.strdisplaywidth(replaced)
    else
      ghost = ghost:sub(1, #ghost - #replaced)
    end
  end
  if ghost == '' and replaced == '' then
    return nil
  end
  return {
    bufnr = bufnr,
    row = row,
    col = col,
    tick = tick,
    line = line,
    insert = insert,
    start_col = start_col,
    end_col = end_col,
    ghost = ghost,
    typed = typed,
    cover = cover,
  }
end

---@return draftwise.Suggestion?
local function make_suggestion(bufnr, client, item, row, col, tick)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local start_col, end_col = col, col
  if type(item.range) == 'table' then
    local r = item.range
    if r.start.line ~= row or r['end'].line ~= row then
      return nil -- the protocol allows only single-line ranges on the cursor's line
    end
    start_col = compat.byte_col(line, r.start.character, client.offset_encoding)
    end_col = compat.byte_col(line, r['end'].character, client.offset_encoding)
    if start_col > col or end_col < col then
      return nil
    end
  end
  local s = fit(bufnr, row, line, col, tick, item_text(item), start_col, end_col)
  if s then
    s.client_id, s.command = client.id, item.command
  end
  return s
end

--- Extra chunks after the suggestion: "(n/m)" when there are alternatives, the timing if asked for.
local function hints(s)
  local out = {}
  if s.items and #s.items > 1 then
    table.insert(out, { (' (%d/%d)'):format(s.index, #s.items), 'DraftwiseHint' })
  end
  local timing = draftwise().config.show_timing_inline and draftwise().timing_text()
  if timing then
    table.insert(out, { ' ' .. timing, 'DraftwiseHint' })
  end
  return out
end

local function draw(s)
  local hl = draftwise().config.highlight
  local lines = vim.split(s.ghost, '\n', { plain = true })
  local opts = { hl_mode = 'combine', priority = 200 }
  if s.extmark then
    opts.id = s.extmark
  end
  local extra = hints(s)
  if lines[1] ~= '' or (#lines == 1 and #extra > 0) or s.cover > 0 then
    local first = lines[1]
    if s.cover > 0 then
      -- Drawn over the auto-closed characters the suggestion replaces, so that they do not show
      -- twice (once here, once at the suggestion's end) until it is accepted.
      first = first .. string.rep(' ', math.max(0, s.cover - vim.fn.strdisplaywidth(first)))
    end
    opts.virt_text = { { first, hl } }
    if #lines == 1 then
      vim.list_extend(opts.virt_text, extra)
    end
    if s.cover > 0 then
      opts.virt_text_pos = 'overlay'
    elseif compat.has('0.10') then
      opts.virt_text_pos = 'inline'
    else
      local line = vim.api.nvim_buf_get_lines(s.bufnr, s.row, s.row + 1, false)[1] or ''
      opts.virt_text_pos = s.col >= #line and 'overlay' or 'eol'
    end
  end
  if #lines > 1 then
    opts.virt_lines = {}
    for i = 2, #lines do
      table.insert(opts.virt_lines, { { lines[i], hl } })
    end
    vim.list_extend(opts.virt_lines[#opts.virt_lines], extra)
  end
  s.extmark = vim.api.nvim_buf_set_extmark(s.bufnr, ns, s.row, s.col, opts)
end

--- Redraws the shown suggestion (new timing, another item); no-op when none is shown.
function M.redraw(bufnr)
  local state = buffers[bufnr or vim.api.nvim_get_current_buf()]
  local s = state and state.suggestion
  if s and vim.api.nvim_buf_is_valid(s.bufnr) then
    draw(s)
  end
end

--- Typing along the shown suggestion keeps it on screen, as VS Code does: when the only change
--- since it was drawn is its next characters, typed at the cursor on its line, it is drawn again
--- after them (its rest, with the same item to accept). Alternatives are dropped.
---@return boolean kept
local function carry(bufnr, s)
  local row, col = cursor()
  local n = col - s.col
  if row ~= s.row or n <= 0 then
    return false
  end
  local next_chars = s.ghost:sub(1, n)
  if #next_chars ~= n or next_chars:find('\n', 1, true) then
    return false
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  if line ~= s.line:sub(1, s.col) .. next_chars .. s.line:sub(s.col + 1) then
    return false -- something else changed too (an auto-closed bracket, another edit)
  end
  local kept = fit(bufnr, row, line, col, vim.api.nvim_buf_get_changedtick(bufnr), s.insert, s.start_col,
    s.end_col + n)
  if not kept or kept.ghost == '' then
    return false -- typed to its end: nothing left to show
  end
  kept.client_id, kept.command, kept.extmark = s.client_id, s.command, s.extmark
  draw(kept)
  buffers[bufnr].suggestion = kept
  return true
end

--- The suggestion shown in bufnr (the current buffer) if it still stands at the cursor, carried
--- along what was typed since; otherwise it is removed and nil returned.
---@return draftwise.Suggestion?
local function shown(bufnr)
  local state = buffers[bufnr]
  local s = state and state.suggestion
  if not s then
    return nil
  end
  local row, col = cursor()
  if s.tick == vim.api.nvim_buf_get_changedtick(bufnr) and row == s.row and col == s.col then
    return s
  end
  if vim.api.nvim_buf_is_valid(bufnr) and carry(bufnr, s) then
    return state.suggestion
  end
  M.clear(bufnr)
  return nil
end

local function reply_items(result)
  if type(result) ~= 'table' then
    return {}
  end
  local out = {}
  for _, item in ipairs(result.items or result) do
    if item_text(item) ~= '' then
      table.insert(out, item)
    end
  end
  return out
end

--- Shows the items of a reply (the first one that fits the cursor first); tests call it with
--- hand-made items to check drawing. Returns whether one is shown.
function M.show_items(bufnr, client, items, row, col, tick)
  bufnr = bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr
  local state = buffers[bufnr]
  if not state then
    return false
  end
  local shown = {}
  for _, item in ipairs(items) do
    local s = make_suggestion(bufnr, client, item, row, col, tick)
    if s then
      table.insert(shown, s)
    end
  end
  if #shown == 0 then
    return false
  end
  clear_extmark(state)
  local s = shown[1]
  s.items, s.index = shown, 1
  draw(s)
  state.suggestion = s
  return true
end

--- Before asking again: stops the request in flight; a suggestion that still stands at the cursor
--- (typed along) stays on screen until a reply replaces it, else it goes. False: the buffer is off.
local function keep_or_clear(bufnr, state)
  if not draftwise().is_enabled(bufnr) then
    M.clear(bufnr)
    return false
  end
  if shown(bufnr) then
    stop(state)
  else
    M.clear(bufnr)
  end
  return true
end

--- Asks the server for a suggestion at the cursor now.
---@param kind integer? 1 = invoked, 2 = automatic
function M.trigger(bufnr, kind)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local state = buffers[bufnr]
  local client = draftwise().client()
  if not state or not client or vim.api.nvim_get_current_buf() ~= bufnr then
    return
  end
  if not keep_or_clear(bufnr, state) then
    return
  end
  local seq = state.seq
  local row, col = cursor()
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local params = compat.position_params(0, client.offset_encoding)
  params.context = { triggerKind = kind or TRIGGER_AUTOMATIC }
  local ok, id = compat.request(client, 'textDocument/inlineCompletion', params, function(err, result)
    if state.seq ~= seq then
      return -- a newer request or an edit superseded this one
    end
    set_pending(state, nil)
    if err then
      vim.notify_once('draftwise: ' .. (err.message or tostring(err)), vim.log.levels.WARN)
      return
    end
    if vim.api.nvim_get_current_buf() ~= bufnr or not in_insert_mode()
      or vim.api.nvim_buf_get_changedtick(bufnr) ~= tick then
      return
    end
    local now_row, now_col = cursor()
    if now_row ~= row or now_col ~= col then
      return
    end
    local shown_now = M.show_items(bufnr, client, reply_items(result), row, col, tick)
    -- Nothing (while the models load the server answers so): asked again once they are ready, if
    -- the cursor is still here (ask_again_after_load).
    state.unanswered = not shown_now and { row = row, col = col, tick = tick, kind = kind or TRIGGER_AUTOMATIC } or nil
    -- At once: the statusline (and the inline timing) show this suggestion's numbers.
    draftwise().get_stats()
  end, bufnr)
  if ok and id then
    set_pending(state, { client = client, id = id })
  end
end

--- The models just became ready: asks again where a request got nothing while they loaded, if the
--- user is still there (current buffer, insert mode, same cursor, buffer unchanged, suggestions on).
function M.ask_again_after_load()
  local bufnr = vim.api.nvim_get_current_buf()
  local state = buffers[bufnr]
  local asked = state and state.unanswered
  for _, s in pairs(buffers) do
    s.unanswered = nil
  end
  if not asked or state.pending or state.suggestion or not in_insert_mode()
    or vim.api.nvim_buf_get_changedtick(bufnr) ~= asked.tick or not draftwise().is_enabled(bufnr) then
    return
  end
  local row, col = cursor()
  if row ~= asked.row or col ~= asked.col then
    return
  end
  M.trigger(bufnr, asked.kind)
end

local function schedule(bufnr)
  local state = buffers[bufnr]
  local config = draftwise().config
  if not state or not config.auto_trigger then
    return
  end
  if not keep_or_clear(bufnr, state) then
    return
  end
  state.timer = state.timer or compat.uv.new_timer()
  state.timer:start(config.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(bufnr) and in_insert_mode() then
      M.trigger(bufnr, TRIGGER_AUTOMATIC)
    end
  end))
end

-- How long the cursor must stay put before the server is told where it rests (moving through a file
-- sends nothing): it starts the suggestion there, or reads its prompt, before anything is asked.
local CURSOR_REST_MS = 150

local function cursor_rested(bufnr)
  local state = buffers[bufnr]
  local client = draftwise().client()
  if not state or not client or vim.api.nvim_get_current_buf() ~= bufnr or not draftwise().is_enabled(bufnr) then
    return
  end
  local params = compat.position_params(0, client.offset_encoding)
  compat.notify(client, 'draftwise/cursor', { textDocument = params.textDocument, position = params.position })
end

local function schedule_cursor(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  state.cursor_timer = state.cursor_timer or compat.uv.new_timer()
  state.cursor_timer:start(CURSOR_REST_MS, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(bufnr) then
      cursor_rested(bufnr)
    end
  end))
end

---@return draftwise.Suggestion?
local function current()
  return shown(vim.api.nvim_get_current_buf())
end

--- Whether a suggestion is shown in the current buffer.
function M.visible()
  return current() ~= nil
end

--- The shown suggestion's text (what Tab would insert after the cursor), for tests and statuslines.
function M.suggestion_text()
  local s = current()
  return s and s.ghost or nil
end

--- A copy of the shown suggestion: `insert` replaces bytes [start_col, end_col) of line `row`
--- (0-based), `ghost` is the part drawn after the cursor at `col`.
---@return {row: integer, col: integer, start_col: integer, end_col: integer, insert: string, ghost: string}?
function M.suggestion()
  local s = current()
  if not s then
    return nil
  end
  return {
    row = s.row, col = s.col, start_col = s.start_col, end_col = s.end_col, insert = s.insert, ghost = s.ghost,
    index = s.index, count = s.items and #s.items or 1,
  }
end

--- Shows the next (count > 0) or previous item of an invoked request, wrapping around; false when
--- there is nothing to cycle.
function M.cycle(count)
  local s = current()
  if not s or not s.items or #s.items < 2 then
    return false
  end
  local state = buffers[s.bufnr]
  local items = s.items
  local index = (s.index - 1 + (count or 1)) % #items + 1
  clear_extmark(state)
  local next_s = items[index]
  next_s.items, next_s.index, next_s.extmark = items, index, nil
  draw(next_s)
  state.suggestion = next_s
  return true
end

local function execute(s, command)
  local client = vim.lsp.get_client_by_id(s.client_id)
  if not client or not command then
    return
  end
  compat.request(client, 'workspace/executeCommand', {
    command = command.command,
    arguments = command.arguments,
  }, function(err)
    if err then
      vim.notify_once('draftwise: ' .. command.command .. ': ' .. (err.message or ''), vim.log.levels.WARN)
    end
    draftwise().refresh_stats_soon()
  end, s.bufnr)
end

local function put_text(s, start_col, end_col, text)
  local lines = vim.split(text, '\n', { plain = true })
  M.clear(s.bufnr)
  vim.api.nvim_buf_set_text(s.bufnr, s.row, start_col, s.row, end_col, lines)
  local last_row = s.row + #lines - 1
  local last_col = #lines == 1 and start_col + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { last_row + 1, last_col })
end

--- Accepts the whole suggestion; false when none is shown.
function M.accept()
  local s = current()
  if not s then
    return false
  end
  put_text(s, s.start_col, s.end_col, s.insert)
  execute(s, s.command)
  return true
end

--- The part of `ghost` that accept-word takes: leading blanks (line breaks and indentation
--- included), then a word or one run of punctuation.
function M.next_word(ghost)
  local blank = ghost:match('^%s*')
  local rest = ghost:sub(#blank + 1)
  local word = rest:match('^[%w_\128-\255]+') or rest:match('^[^%w_%s\128-\255]+') or ''
  return blank .. word
end

--- The part of `ghost` that accept-line takes: up to the end of its first non-empty line.
function M.first_line(ghost)
  local newline = ghost:find('\n', 1, true)
  if newline == 1 then
    newline = ghost:find('\n', 2, true)
  end
  return newline and ghost:sub(1, newline - 1) or ghost
end

--- Tells the server that the first `part` of the item was taken (it counts it, and the rest becomes
--- its next answer); `kind` is "word" or "line". The length is in characters (code points), plus
--- what the user had typed of the item before.
function M.report_partial(s, part, kind)
  local client = vim.lsp.get_client_by_id(s.client_id)
  local commands = client and client.server_capabilities.executeCommandProvider
  local item_info = s.command and s.command.arguments and s.command.arguments[1]
  if type(item_info) ~= 'table' or not commands
    or not vim.tbl_contains(commands.commands or {}, 'draftwise.partiallyAccepted') then
    return
  end
  local length = vim.fn.strchars(s.typed) + vim.fn.strchars(part)
  execute(s, {
    command = 'draftwise.partiallyAccepted',
    arguments = { vim.tbl_extend('force', item_info, { acceptedLength = length, kind = kind }) },
  })
end

local function accept_part(take, kind)
  local s = current()
  if not s then
    return false
  end
  local part = take(s.ghost)
  if part == s.ghost or part == '' then
    return M.accept()
  end
  put_text(s, s.col, s.col, part)
  M.report_partial(s, part, kind)
  return true
end

--- Accepts up to the end of the suggestion's first non-empty line; false when none is shown.
function M.accept_line()
  return accept_part(M.first_line, 'line')
end

--- Accepts the suggestion's next word; false when none is shown.
function M.accept_word()
  return accept_part(M.next_word, 'word')
end

--- Hides the suggestion; false when none is shown.
function M.dismiss()
  local bufnr = vim.api.nvim_get_current_buf()
  local shown = current() ~= nil
  M.clear(bufnr)
  return shown
end

--- Starts watching bufnr for typing.
function M.attach(bufnr, client)
  if buffers[bufnr] then
    return
  end
  local group = vim.api.nvim_create_augroup('draftwise_ghost_' .. bufnr, { clear = true })
  buffers[bufnr] = { seq = 0, group = group }
  vim.api.nvim_create_autocmd({ 'TextChangedI', 'TextChangedP' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      schedule(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertEnter', 'CursorMovedI' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      -- Moving away from a shown suggestion drops it, typing along it keeps it; the edit that moved
      -- the cursor schedules anew.
      if not shown(bufnr) then
        schedule(bufnr)
      end
    end,
  })
  vim.api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI', 'BufEnter' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      schedule_cursor(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.detach(bufnr)
    end,
  })
  if client and vim.api.nvim_get_current_buf() == bufnr and in_insert_mode() then
    schedule(bufnr)
  end
  if client and vim.api.nvim_get_current_buf() == bufnr then
    schedule_cursor(bufnr)
  end
end

function M.detach(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  M.clear(bufnr)
  for _, key in ipairs({ 'timer', 'cursor_timer' }) do
    local timer = state[key]
    if timer then
      timer:stop()
      if not timer:is_closing() then
        timer:close()
      end
    end
  end
  pcall(vim.api.nvim_del_augroup_by_id, state.group)
  buffers[bufnr] = nil
end

M.namespace = ns

--- Whether a request is in flight for bufnr (tests use it to know a reply has been handled).
function M._pending(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local state = buffers[bufnr]
  return state ~= nil and state.pending ~= nil
end

return M
