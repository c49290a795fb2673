-- A stand-in for Neovim 0.12's vim.lsp.inline_completion on 0.11 (no 0.12 build is installable
-- here), following the public contract of runtime/lua/vim/lsp/inline_completion.lua:
--   enable(on, { bufnr }), is_enabled({ bufnr }), select({ count }), and
--   get({ on_accept }) -> boolean: with an item shown it returns true and, scheduled, hides it, calls
--   on_accept(item) and applies what that returns (nothing for nil) the way Neovim does: the item's
--   text over the item's range, then the item's command.
-- Items are { client_id, insert_text, range = vim.Range-like (:to_extmark()) | Range4, command }.
-- What it does not model: drawing, requesting, debouncing (tests put items in with _show).
local M = { enabled = {}, items = {}, index = 0, calls = {} }

function M.range(row, col, end_row, end_col)
  return {
    to_extmark = function()
      return row, col, end_row, end_col
    end,
  }
end

function M.enable(on, filter)
  local bufnr = filter and filter.bufnr or 0
  table.insert(M.calls, { 'enable', on ~= false, bufnr })
  M.enabled[bufnr] = on ~= false
  if on == false then
    M.items, M.index = {}, 0
  end
end

function M.is_enabled(filter)
  return M.enabled[filter and filter.bufnr or 0] == true
end

function M._show(items)
  M.items, M.index = items, 1
end

function M.current()
  return M.items[M.index]
end

function M.select(opts)
  local n = #M.items
  if n == 0 then
    return
  end
  M.index = (M.index - 1 + (opts and opts.count or 1)) % n + 1
end

local function apply(item)
  local r = item.range
  local row, col, end_row, end_col
  if r and r.to_extmark then
    row, col, end_row, end_col = r:to_extmark()
  elseif r then
    row, col, end_row, end_col = r[1], r[2], r[3], r[4]
  else
    local pos = vim.api.nvim_win_get_cursor(0)
    row, col, end_row, end_col = pos[1] - 1, pos[2], pos[1] - 1, pos[2]
  end
  local lines = vim.split(item.insert_text, '\n')
  vim.api.nvim_buf_set_text(0, row, col, end_row, end_col, lines)
  vim.api.nvim_win_set_cursor(0, { row + #lines, (#lines == 1 and col or 0) + #lines[#lines] })
  M.applied_by_default = (M.applied_by_default or 0) + 1
end

function M.get(opts)
  opts = opts or {}
  local item = M.items[M.index]
  if not item then
    return false
  end
  vim.schedule(function()
    M.items, M.index = {}, 0
    local on_accept = opts.on_accept
    if on_accept then
      item = on_accept(item)
    end
    if item then
      apply(item)
    end
  end)
  return true
end

return M
