-- The plugin's keys on top of Neovim 0.12's vim.lsp.inline_completion (setup{ native = true }).
--
-- Neovim draws and requests; this module only accepts (all, a word, a line), cycles, dismisses, and
-- reports partial accepts. It talks to the native module through its public functions only:
--   enable(on, { bufnr }), get({ on_accept = fn }) -> boolean, select({ count })
-- where on_accept receives the current item { client_id, insert_text, range?, command? } (range a
-- vim.Range with :to_extmark(), or a 0-based { row, col, end_row, end_col } list in pre-release
-- builds) and applies nothing when it returns nil.
--
-- The native client keeps showing an item while the user types along it, but its own accept puts
-- the item's text over the item's original range: the characters typed since would stay after it,
-- doubled. Every accept here therefore replaces from the range's start up to the cursor.
local compat = require('draftwise.compat')
local ghost = require('draftwise.ghost')

local M = {}

local function api()
  return vim.lsp.inline_completion
end

local function draftwise()
  return require('draftwise')
end

--- The item's range as 0-based (row, col, end_row, end_col) byte positions, or nil when it has none.
local function item_range(item)
  local r = item.range
  if type(r) ~= 'table' then
    return nil
  end
  if type(r.to_extmark) == 'function' then
    return r:to_extmark()
  end
  if type(r[1]) == 'number' then
    return r[1], r[2], r[3], r[4]
  end
  return nil
end

local function item_text(item)
  local text = item.insert_text
  if type(text) == 'table' then
    return text.kind ~= 'snippet' and text.value or nil -- snippets are left to Neovim
  end
  return text
end

--- What accepting `item` now should do: replace bytes [start_col, end_col) of `row` with `text`,
--- where the user may have typed part of the item since it arrived. `ghost` is the part not typed.
--- Nil when the item does not continue what is on the line (Neovim's own accept then applies it).
---@return {row: integer, start_col: integer, end_col: integer, text: string, ghost: string, typed: string}?
function M.edit_for(bufnr, item, cursor_row, cursor_col)
  local text = item_text(item)
  if not text then
    return nil
  end
  local row, start_col, end_row, end_col = item_range(item)
  if not row then
    row, start_col, end_row, end_col = cursor_row, cursor_col, cursor_row, cursor_col
  end
  if row ~= cursor_row or end_row ~= row or cursor_col < start_col then
    return nil
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local typed = line:sub(start_col + 1, cursor_col)
  if text:sub(1, #typed) ~= typed then
    return nil
  end
  return {
    row = row,
    start_col = start_col,
    end_col = math.min(math.max(end_col, cursor_col), #line),
    text = text,
    ghost = text:sub(#typed + 1),
    typed = typed,
  }
end

local function run_command(bufnr, item, command)
  local client = command and vim.lsp.get_client_by_id(item.client_id)
  if not client then
    return
  end
  compat.request(client, 'workspace/executeCommand', { command = command.command, arguments = command.arguments },
    function()
      draftwise().refresh_stats_soon()
    end, bufnr)
end

local function put(bufnr, row, start_col, end_col, text)
  local lines = vim.split(text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(bufnr, row, start_col, row, end_col, lines)
  local last_col = #lines == 1 and start_col + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + #lines, last_col })
end

-- Accepts through get(): `take(ghost)` is how much of the untyped part to insert (nil: all of it).
local function accept_with(take, kind)
  local native = api()
  if not native then
    return false
  end
  local bufnr = vim.api.nvim_get_current_buf()
  return native.get({
    bufnr = bufnr,
    on_accept = function(item)
      local pos = vim.api.nvim_win_get_cursor(0)
      local edit = M.edit_for(bufnr, item, pos[1] - 1, pos[2])
      if not edit then
        return item -- not a continuation of the line: Neovim's own accept
      end
      local part = take and take(edit.ghost) or edit.ghost
      if part == edit.ghost then
        put(bufnr, edit.row, edit.start_col, edit.end_col, edit.text)
        run_command(bufnr, item, item.command)
      else
        put(bufnr, edit.row, pos[2], pos[2], part)
        ghost.report_partial({
          client_id = item.client_id,
          command = item.command,
          typed = edit.typed,
          bufnr = bufnr,
        }, part, kind)
      end
      return nil
    end,
  }) == true
end

function M.accept()
  return accept_with(nil)
end

function M.accept_line()
  return accept_with(ghost.first_line, 'line')
end

function M.accept_word()
  return accept_with(ghost.next_word, 'word')
end

--- Next/previous item; Neovim shows "(n/m)" itself.
function M.cycle(count)
  local native = api()
  if not native or not native.select then
    return false
  end
  native.select({ count = count })
  return true
end

--- Hides the suggestion: the native module has no dismiss, so it is turned off and on again for the
--- buffer (which drops its item; the next edit asks anew).
function M.dismiss()
  local native = api()
  local bufnr = vim.api.nvim_get_current_buf()
  if not native or not native.is_enabled({ bufnr = bufnr }) then
    return false
  end
  native.enable(false, { bufnr = bufnr })
  native.enable(true, { bufnr = bufnr })
  return true
end

--- The native module asks by itself as you type; an explicit request is what get() does when no item
--- is shown (in the builds that have it).
function M.trigger()
  local native = api()
  if native then
    native.get()
  end
end

local attached = {}

function M.attach(bufnr, client)
  local native = api()
  if not native or attached[bufnr] then
    return
  end
  attached[bufnr] = true
  native.enable(draftwise().is_enabled(bufnr), { bufnr = bufnr })
  -- "generating…" and the stats in the statusline: the native client's requests show as LspRequest.
  if compat.has('0.10') then
    vim.api.nvim_create_autocmd('LspRequest', {
      buffer = bufnr,
      group = vim.api.nvim_create_augroup('draftwise_native_' .. bufnr, { clear = true }),
      callback = function(ev)
        local request = ev.data and ev.data.request
        if not request or request.method ~= 'textDocument/inlineCompletion'
          or (client and ev.data.client_id ~= client.id) then
          return
        end
        draftwise().generating(request.type == 'pending')
        if request.type == 'complete' then
          draftwise().get_stats()
        end
      end,
    })
  end
end

--- Follows :DraftwiseEnable/Disable/Snooze for the buffers the native module serves.
function M.sync_enabled()
  local native = api()
  if not native then
    return
  end
  for bufnr in pairs(attached) do
    if vim.api.nvim_buf_is_valid(bufnr) then
      native.enable(draftwise().is_enabled(bufnr), { bufnr = bufnr })
    else
      attached[bufnr] = nil
    end
  end
end

return M
