;;; opencortex-chat.el --- The *opencortex-chat* buffer  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The chat buffer and everything that writes into it: an org-mode buffer
;; whose transcript is read-only and whose input area sits at the end, after
;; a prompt line.  Output from the kernel is always inserted before the
;; prompt, at `opencortex--output-marker', so the person's point and the text
;; they are typing never move.
;;
;; Nothing here talks to the kernel directly: every outgoing call goes through
;; `opencortex--request', which calls `opencortex--call-function' (the EPC
;; connection in opencortex.el; a recorder in the tests).
;;
;; Everything the kernel sends passes `opencortex--visible' before it is
;; inserted, and text the model wrote inside a kernel block goes through
;; `opencortex--inert-line' (see opencortex-untrusted.el).  And org itself
;; asks before a link or a code block in the buffer runs anything.

;;; Code:

(require 'cl-lib)
(require 'org)
(require 'subr-x)
(require 'opencortex-untrusted)

;;;; Options

(defcustom opencortex-chat-buffer-name "*opencortex-chat*"
  "Name of the chat buffer."
  :type 'string
  :group 'opencortex)

(defcustom opencortex-chat-id "main"
  "Chat id of the Emacs chat; the kernel's thread is \"emacs:<id>\"."
  :type 'string
  :group 'opencortex)

(defcustom opencortex-prompt "* Message  (C-c RET sends, C-c C-k aborts)\n"
  "Read-only line before the input area; it should end with a newline."
  :type 'string
  :group 'opencortex)

(defcustom opencortex-after-insert-hook nil
  "Functions called with (BEG END) after opencortex changed a buffer.
They run with that buffer current, once per buffer update (a coalesced
batch of streamed text counts as one update)."
  :type 'hook
  :group 'opencortex)

(defface opencortex-error-face
  '((t :inherit error))
  "Face of errors shown in the chat buffer."
  :group 'opencortex)

(defface opencortex-model-note-face
  '((t :inherit font-lock-doc-face :slant italic))
  "Face of the model's own words quoted in a block the kernel drew.
An approval shows what the model said about its request in this face,
so that it never reads as the kernel's account of what will run."
  :group 'opencortex)

;;;; State shared by the chat files

(defvar opencortex--call-function 'opencortex--call
  "Function that sends one call to the kernel.
Called as (METHOD ARGS ON-SUCCESS ON-ERROR): METHOD a symbol, ARGS a
list, ON-SUCCESS called with the result, ON-ERROR with a message string
\(either may be nil).  Tests bind it to record calls instead.")

(defvar opencortex--status nil
  "The latest status plist from the kernel (see `opencortex--format-header').")

(defvar opencortex--kernel-state nil
  "State of the kernel connection, for the header line.
One of nil, `starting', `authenticating', `ready', `dead', `stopped', `failed'.")

(defvar opencortex--thread nil
  "Thread of the chat as the kernel named it (\"emacs:main\").")

(defvar-local opencortex--output-marker nil
  "Where output goes: the end of the transcript, just before the prompt.")

(defvar-local opencortex--input-marker nil
  "Start of the input area (after the prompt); it runs to the end of the buffer.")

(defvar-local opencortex--last-output-kind nil
  "Kind of the latest output: `insert' (kernel text), `stream', or ours.")

(defun opencortex--request (method args &optional on-success on-error)
  "Send METHOD with ARGS to the kernel through `opencortex--call-function'.
ON-SUCCESS gets the result; ON-ERROR a message (default: shown in the buffer)."
  (let ((call opencortex--call-function))
    (when (and (symbolp call) (not (fboundp call)))
      (require 'opencortex))
    (funcall call method args on-success on-error)))

;;;; The buffer

(defvar opencortex-chat-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "C-c RET") 'opencortex-send)
    (define-key map (kbd "C-c C-k") 'opencortex-abort)
    (define-key map (kbd "C-c C-a") 'opencortex-approve)
    (define-key map (kbd "C-c C-d") 'opencortex-deny)
    map)
  "Keymap of `opencortex-chat-mode'.")

(easy-menu-define opencortex-chat-mode-menu opencortex-chat-mode-map
  "Menu of the opencortex chat buffer."
  '("Opencortex"
    ["Send" opencortex-send]
    ["Abort the turn" opencortex-abort]
    "---"
    ["Approve" opencortex-approve :active (opencortex-pending-approvals)]
    ["Deny" opencortex-deny :active (opencortex-pending-approvals)]
    "---"
    ["Fork a branch" opencortex-fork]
    ["Rewind to a turn..." opencortex-rewind]
    ["Switch branch..." opencortex-switch-branch]
    "---"
    ["Open the archive" opencortex-open-memory]
    ["Reload skills" opencortex-reload-skills]
    ["Set the backend..." opencortex-set-backend]
    ["Set the model..." opencortex-set-model]
    ["Restart the kernel" opencortex-restart]
    ["Stop the kernel" opencortex-stop]
    "---"
    ["Customize" (customize-group 'opencortex)]))

(define-derived-mode opencortex-chat-mode org-mode "opencortex"
  "Major mode of the chat buffer: talk to the opencortex kernel.
The buffer is an org document.  The transcript above the prompt is
read-only; type your message below the prompt.

\\[opencortex-send] sends it; a line starting with / is a slash command
\(/help lists them).  \\[opencortex-abort] aborts the turn that is running.
The reply streams in and becomes an org subtree.

When the kernel asks before it runs a command or posts elsewhere, the
request shows what would run, where, and which skill asked;
\\[opencortex-approve] approves and \\[opencortex-deny] denies the latest one
\(or use its buttons).  No answer in time means no.

Branches: \\[opencortex-fork] starts a new branch (from the latest turn, or
with a prefix argument from a turn you name), \\[opencortex-rewind] goes back
to an earlier turn, \\[opencortex-switch-branch] moves to another branch.  The
header line shows the turn, the branch, the context in use, the cost
\(\"—\" for a model without a price) and the average latency.

The kernel: \\[opencortex-set-backend] and \\[opencortex-set-model] choose what
answers, \\[opencortex-reload-skills] reloads the skills, \\[opencortex-open-memory]
opens the org archive of this chat, \\[opencortex-restart] and \\[opencortex-stop]
restart and stop it.

Links and code blocks in this buffer may come from the model: following
an elisp or shell link, or evaluating a block, always asks first.

\\{opencortex-chat-mode-map}"
  :group 'opencortex
  (setq-local header-line-format '(:eval (opencortex--header-line)))
  ;; Whatever the person's settings, nothing the model wrote runs unasked.
  (setq-local org-confirm-babel-evaluate t)
  (setq-local org-link-elisp-confirm-function #'yes-or-no-p)
  (setq-local org-link-shell-confirm-function #'yes-or-no-p)
  (setq-local org-link-elisp-skip-confirm-regexp "")
  (opencortex--setup-input-area))

(defun opencortex--chat-buffer ()
  "The chat buffer, created and set up when missing."
  (let ((buffer (get-buffer-create opencortex-chat-buffer-name)))
    (with-current-buffer buffer
      (unless (and (derived-mode-p 'opencortex-chat-mode)
                   (markerp opencortex--input-marker))
        (opencortex-chat-mode)))
    buffer))

;;;; Text from the kernel

(defun opencortex--read-only (text &optional face)
  "TEXT as transcript: read-only, in FACE when non-nil."
  (let ((text (copy-sequence text)))
    (add-text-properties 0 (length text) '(read-only t front-sticky (read-only)) text)
    (when face
      (add-text-properties 0 (length text) (list 'face face 'font-lock-face face) text))
    text))

(defun opencortex--setup-input-area ()
  "Put the prompt at the end of the buffer and the markers around it."
  (let ((inhibit-read-only t)
        (prompt (opencortex--read-only opencortex-prompt)))
    (put-text-property (1- (length prompt)) (length prompt) 'rear-nonsticky t prompt)
    (save-excursion
      (goto-char (point-max))
      (unless (bolp) (insert (opencortex--read-only "\n")))
      (add-text-properties (point-min) (point) '(read-only t front-sticky (read-only)))
      (setq opencortex--output-marker (point-marker))
      (insert prompt)
      (set-marker-insertion-type opencortex--output-marker t)
      (setq opencortex--input-marker (point-marker))))
  (goto-char (point-max)))

(defun opencortex--input-text ()
  "The text in the input area."
  (with-current-buffer (opencortex--chat-buffer)
    (buffer-substring-no-properties opencortex--input-marker (point-max))))

(defun opencortex--take-input ()
  "Remove and return the text of the input area."
  (with-current-buffer (opencortex--chat-buffer)
    (prog1 (opencortex--input-text)
      (delete-region opencortex--input-marker (point-max)))))

(defun opencortex--restore-input (text)
  "Put TEXT back into the input area when the person has not typed anything new."
  (with-current-buffer (opencortex--chat-buffer)
    (when (string-empty-p (string-trim (opencortex--input-text)))
      (save-excursion
        (delete-region opencortex--input-marker (point-max))
        (goto-char opencortex--input-marker)
        (insert text)))))

;;;; Writing output

(defun opencortex--with-output (function)
  "Call FUNCTION in the chat buffer with point at the output position.
Read-only text may be changed; point, windows and the input area stay
where they are.  Output is not undoable and clears the undo list (the
positions it holds would be stale).  Afterwards the prompt still starts
a line of its own (see `opencortex--keep-prompt-on-its-line')."
  (with-current-buffer (opencortex--chat-buffer)
    (let ((inhibit-read-only t)
          (undo-enabled (not (eq buffer-undo-list t))))
      (prog1 (let ((buffer-undo-list t))
               (prog1 (save-excursion
                        (goto-char opencortex--output-marker)
                        (funcall function))
                 (opencortex--keep-prompt-on-its-line)))
        (when undo-enabled (setq buffer-undo-list nil))))))

(defun opencortex--keep-prompt-on-its-line ()
  "Keep the prompt at the start of a line, whatever the transcript ends with.
Output that ends inside a line (a reply still streaming, kernel text
that continues later) would run into the prompt, and the prompt would
no longer be a heading.  While the transcript's last line is open, a
read-only newline that is not part of the transcript sits between them;
it goes when the transcript ends its line.  Call it with the chat buffer
current and `inhibit-read-only' bound."
  (let* ((out opencortex--output-marker)
         (open (not (or (= out (point-min)) (eq (char-before out) ?\n))))
         (separated (get-text-property out 'opencortex-separator)))
    (cond ((and open (not separated))
           (save-excursion
             (goto-char out)
             (insert (propertize "\n" 'opencortex-separator t 'read-only t
                                 'front-sticky '(read-only)))
             (set-marker out (1- (point)))))
          ((and separated (not open))
           (delete-region out (1+ out))))))

(defun opencortex--changed (beg end)
  "Run `opencortex-after-insert-hook' for BEG..END of the current buffer."
  (run-hook-with-args 'opencortex-after-insert-hook beg end))

(defun opencortex--fresh-line ()
  "Start a new line at point unless point is at the beginning of one."
  (unless (bolp) (insert (opencortex--read-only "\n"))))

(defun opencortex--output (text &optional face kind)
  "Insert TEXT at the end of the transcript; return its end position.
FACE colours it.  Text starts on a line of its own, except kernel text
\(KIND `insert') that continues the previous kernel text: a long text the
kernel split in pieces arrives exactly as it was.  A heading (\"* \")
always starts a line."
  (opencortex--with-output
   (lambda ()
     (unless (and (eq kind 'insert) (eq opencortex--last-output-kind 'insert)
                  (not (string-prefix-p "* " text)))
       (opencortex--fresh-line))
     (let ((beg (point)))
       (insert (opencortex--read-only (opencortex--visible text) face))
       (setq opencortex--last-output-kind (or kind 'block))
       (opencortex--changed beg (point))
       (point)))))

(defun opencortex--ensure-newline (text)
  "TEXT ending with a newline."
  (if (string-suffix-p "\n" text) text (concat text "\n")))

(defun opencortex--show-error (text)
  "Show TEXT in the chat buffer as an error."
  (opencortex--output (opencortex--ensure-newline (concat "Error: " text))
                      'opencortex-error-face 'error))

(defun opencortex--show-note (text)
  "Show TEXT in the chat buffer as a note from opencortex itself."
  (opencortex--output (opencortex--ensure-newline text) 'shadow 'note))

;;;; Methods the kernel calls (each returns t)

(defun opencortex--check-string (value what)
  "Signal an error unless VALUE, the argument WHAT, is a string."
  (unless (stringp value)
    (error "The argument %s must be a string, not %S" what (type-of value))))

(defun opencortex--handle-insert (buffer text)
  "Method `opencortex-insert': insert TEXT at the end of BUFFER.
In the chat buffer the text goes before the input area."
  (opencortex--check-string buffer "buffer")
  (opencortex--check-string text "text")
  (if (equal buffer opencortex-chat-buffer-name)
      (opencortex--output text nil 'insert)
    (with-current-buffer (get-buffer-create buffer)
      (when buffer-read-only
        (error "Buffer %s is read-only" buffer))
      (save-excursion
        (goto-char (point-max))
        (let ((beg (point)))
          (insert (opencortex--visible text))
          (opencortex--changed beg (point))))))
  t)

(defun opencortex--handle-show-error (text)
  "Method `opencortex-show-error': show TEXT as an error in the chat buffer."
  (opencortex--check-string text "text")
  (opencortex--show-error text)
  t)

;;;; Status and the header line

(defun opencortex--set-status (status)
  "Remember STATUS (a plist from the kernel) and redraw the header line."
  (when (and (listp status) (keywordp (car-safe status)))
    (setq opencortex--status status))
  (opencortex--update-header))

(defun opencortex--update-header ()
  "Redraw the chat buffer's header line."
  (let ((buffer (get-buffer opencortex-chat-buffer-name)))
    (when buffer
      (with-current-buffer buffer (force-mode-line-update)))))

(defun opencortex--number (value format-string)
  "VALUE formatted with FORMAT-STRING, or \"-\" when it is not a number."
  (if (numberp value) (format format-string value) "-"))

(defun opencortex--cost-text (status)
  "The cost in STATUS for the header line.
\"—\" when nothing could be priced: the cost is 0 and some turns ran on a
model without a price (:unpriced-turns above 0, or :cost-known present
and false).  A cost above 0 with unpriced turns is a lower bound: \"≥$…\"."
  (let* ((cost (plist-get status :cost-usd))
         (unpriced (plist-get status :unpriced-turns))
         (partial (or (and (numberp unpriced) (> unpriced 0))
                      (and (plist-member status :cost-known)
                           (null (plist-get status :cost-known))))))
    (cond ((not (numberp cost)) "$-")
          ((and partial (zerop cost)) "—")
          (partial (format "≥$%.4f" cost))
          (t (format "$%.4f" cost)))))

(defun opencortex--format-header (status state)
  "The header text for STATUS (a plist) and connection STATE (a symbol).
STATUS holds :turn, :branch, :context-percent, :cost-usd (with
:unpriced-turns or :cost-known, see `opencortex--cost-text'),
:latency-ms (average), :backend and :warning."
  (let ((parts (list (if (memq state '(ready nil))
                         "opencortex"
                       (format "opencortex [%s]" state)))))
    (when status
      (push (concat "turn " (opencortex--number (plist-get status :turn) "%d")) parts)
      (let ((branch (plist-get status :branch)))
        (when (and (stringp branch) (not (string-empty-p branch)))
          (push (concat "branch " (opencortex--one-line branch 40)) parts)))
      (push (concat "context " (opencortex--number (plist-get status :context-percent) "%.1f")
                    "%")
            parts)
      (push (opencortex--cost-text status) parts)
      (push (concat "avg " (opencortex--number (plist-get status :latency-ms) "%.0f") " ms")
            parts)
      (let ((backend (plist-get status :backend)))
        (when (stringp backend) (push (opencortex--one-line backend 40) parts)))
      (let ((warning (plist-get status :warning)))
        (when (and (stringp warning) (not (string-empty-p warning)))
          (push (propertize (opencortex--one-line warning 200) 'face 'warning) parts))))
    (mapconcat #'identity (nreverse parts) " | ")))

(defun opencortex--header-line ()
  "The header line of the chat buffer (with `%' escaped for the mode line)."
  (replace-regexp-in-string
   "%" "%%" (opencortex--format-header opencortex--status opencortex--kernel-state) t t))

(defun opencortex--refresh-status ()
  "Ask the kernel for the status; the header line follows."
  (opencortex--request 'status (list opencortex-chat-id) #'opencortex--set-status #'ignore))

(provide 'opencortex-chat)
;;; opencortex-chat.el ends here
