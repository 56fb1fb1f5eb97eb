;;; opencortex.el --- Chat with LLM-driven skills through the opencortex kernel  -*- lexical-binding: t; coding: utf-8 -*-

;; Copyright (C) 2026 The opencortex maintainers

;; Author: The opencortex maintainers <maintainers@users.noreply.a-seed-ac41129b.example>
;; Maintainer: The opencortex maintainers <maintainers@users.noreply.a-seed-ac41129b.example>
;; Version: 0.1.0
;; Package-Requires: ((emacs "28.1") (epc "0.1.1"))
;; Keywords: tools, convenience
;; URL: https://github.com/opencortex/opencortex
;; SPDX-License-Identifier: GPL-3.0-or-later

;; This file is not part of GNU Emacs.

;; This program is free software; you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; M-x opencortex-chat connects over EPC to the opencortex kernel running
;; for `opencortex-home', starting one (`opencortex serve') only when none
;; runs there, and opens the *opencortex-chat* buffer.  Type below
;; the prompt and press C-c RET; the reply streams in as an org subtree.
;; C-h m in that buffer lists its commands.  From any buffer, M-x
;; opencortex-send-region sends the region (with C-u, a question about it).
;;
;; Emacs finds the kernel by itself: the opencortex of the Python
;; installation these files came with (a source checkout's .venv, or the
;; installation of the wheel that ships them), else `opencortex' on
;; `exec-path', else "python3 -m opencortex".  Set `opencortex-program'
;; when it should run another one.  Exactly one kernel runs per home:
;; every kernel writes a connection file for its home, and Emacs connects
;; to the kernel it names instead of starting a second one (a kernel
;; Emacs did not start, Emacs never stops or restarts).  M-x
;; opencortex-connect reaches a kernel through a connection file you name.
;;
;; Files: opencortex-kernel.el (the kernel's program, home and connection
;; file), opencortex-connection.el (the kernel process and the EPC
;; connection), opencortex-recovery.el (a kernel lost: restarted,
;; reconnected or joined), opencortex-chat.el (the buffer, output, header line),
;; opencortex-stream.el (turns and streamed replies), opencortex-approval.el
;; (approving what the kernel wants to run), opencortex-tools.el and
;; opencortex-tools-org.el (what the kernel's Emacs tools do in Emacs: read
;; and edit buffers; file notes, list the agenda, show files).  This file
;; holds the commands, connection files, and `opencortex-wait-idle' for
;; tests and scripts.

;;; Code:

(require 'json)
(require 'subr-x)

(defgroup opencortex nil
  "Chat with LLM-driven skills through the opencortex kernel."
  :group 'tools
  :prefix "opencortex-")

(require 'opencortex-connection)
(require 'opencortex-recovery)
(require 'opencortex-tools)
(require 'opencortex-tools-org)

(defcustom opencortex-connection-file nil
  "Connection file of a kernel started on its own, read by `opencortex-connect'.
nil means the file of the kernel running for `opencortex-home':
kernel-HASH.json in $XDG_RUNTIME_DIR/opencortex, or in
/tmp/opencortex-UID without XDG_RUNTIME_DIR."
  :type '(choice (const :tag "The kernel of `opencortex-home'" nil) file)
  :group 'opencortex)

(defcustom opencortex-wait-timeout 30
  "Default bound in seconds of `opencortex-wait-idle' and `opencortex-wait-for'.
Commands that need the kernel's answer before they go on (the branches
`opencortex-switch-branch' offers) wait at most this long too."
  :type 'number
  :group 'opencortex)

;;;; Connection files

(defun opencortex--default-connection-file ()
  "Return the connection file for `opencortex-connect' without an argument."
  (or opencortex-connection-file (opencortex--home-connection-file)))

;;;; Waiting (for tests and scripts)

(defun opencortex--busy-p ()
  "Return non-nil while anything is under way: a start, a request, a turn, text."
  (let ((conn opencortex--connection))
    (or (timerp opencortex--restart-timer)
        (and conn (memq (opencortex--connection-state conn) '(starting authenticating)))
        (and conn (> (hash-table-count (opencortex--connection-pending conn)) 0))
        (opencortex--turns-busy-p))))

(defun opencortex-wait-for (predicate &optional timeout)
  "Process kernel output until PREDICATE gives non-nil; return that value.
Give up after TIMEOUT seconds (default `opencortex-wait-timeout') and
return nil."
  (let ((deadline (+ (float-time) (or timeout opencortex-wait-timeout)))
        value)
    ;; Short slices: a reply's deferred callback runs from a timer, so a
    ;; long slice would add its length to every round trip.
    (while (and (not (setq value (funcall predicate)))
                (< (float-time) deadline))
      (accept-process-output nil 0.001))
    value))

(defun opencortex-wait-idle (&optional timeout)
  "Wait until nothing is under way: no turn in flight, no call unanswered.
Return t when idle, nil when TIMEOUT seconds (default
`opencortex-wait-timeout') passed first."
  (and (opencortex-wait-for (lambda () (not (opencortex--busy-p))) timeout) t))

(defun opencortex-kernel-process ()
  "The kernel process Emacs started, or nil (also when connected to another's)."
  (let ((conn opencortex--connection))
    (and conn (opencortex--connection-process conn))))

;;;; Commands

;;;###autoload
(defun opencortex-chat ()
  "Open the chat buffer, connected to the kernel of `opencortex-home'.
Exactly one kernel runs per home: when one already runs there (its
connection file names a live process), Emacs connects to it; only when
none runs does Emacs start one.  A kernel Emacs did not start, Emacs
never stops or restarts."
  (interactive)
  (let ((buffer (opencortex--chat-buffer)))
    (unless (opencortex--live-p opencortex--connection)
      (opencortex--connect-or-start))
    (pop-to-buffer-same-window buffer)
    buffer))

;;;###autoload
(defun opencortex-connect (&optional file)
  "Connect to a kernel started on its own, through its connection FILE.
FILE defaults to `opencortex-connection-file', else the connection file
of the kernel running for `opencortex-home'."
  (interactive)
  (let ((kernel (opencortex--read-connection-file
                 (or file (opencortex--default-connection-file)))))
    (when (opencortex--live-p opencortex--connection)
      (opencortex--shutdown opencortex--connection))
    (let ((conn (opencortex--connect-kernel kernel)))
      (when (called-interactively-p 'any)
        (pop-to-buffer-same-window (opencortex--chat-buffer)))
      conn)))

(defun opencortex-stop ()
  "Stop the kernel Emacs started, or disconnect from one it did not start."
  (interactive)
  (when (timerp opencortex--restart-timer)
    (cancel-timer opencortex--restart-timer)
    (setq opencortex--restart-timer nil))
  (setq opencortex--auto-restarts 0)
  (let ((conn opencortex--connection))
    (when (opencortex--live-p conn)
      (opencortex--shutdown conn)
      (if (opencortex--connection-process conn)
          (message "opencortex: kernel stopped")
        (message "opencortex: disconnected; the kernel%s keeps running"
                 (opencortex--home-words conn))))))

(defun opencortex-restart ()
  "Stop the kernel Emacs started and start a new one.
A kernel Emacs did not start is not Emacs's to restart: Emacs
disconnects and connects to the kernel running for the home again (and
starts one only when none runs)."
  (interactive)
  (let ((started (opencortex-kernel-process)))
    (opencortex-stop)
    (if started
        (opencortex--start-kernel)
      (opencortex--connect-or-start))))

(defun opencortex--slash-command (text &optional from-input)
  "Run the slash command TEXT in the kernel; show it and its answer.
With FROM-INPUT, TEXT came from the input area: it goes back there when
the kernel could not take it."
  (opencortex--request
   'slash-command (list opencortex-chat-id text)
   (lambda (reply)
     (let ((answer (and (listp reply) (plist-get reply :text))))
       (opencortex--output (format "* %s\n%s" (opencortex--inert-line text)
                                   (opencortex--ensure-newline
                                    (if (stringp answer) answer "")))
                           nil 'slash))
     (opencortex--refresh-status))
   (lambda (message)
     (opencortex--show-error (format "The command %s failed: %s" text message))
     (when from-input (opencortex--restore-input text)))))

(defun opencortex-send (&optional text)
  "Send TEXT, by default the input area, to the kernel.
A text starting with / is a slash command; anything else a message."
  (interactive)
  (let* ((from-input (null text))
         (text (string-trim (or text (opencortex--take-input)))))
    (cond
     ((string-empty-p text)
      (user-error "Nothing to send: type below the prompt, then C-c RET"))
     ((string-prefix-p "/" text)
      (opencortex--slash-command text from-input))
     (t
      (opencortex--output (format "* You\n%s\n" text) nil 'you)
      (opencortex--request
       'send-message (list opencortex-chat-id text)
       (lambda (reply)
         (setq opencortex--thread (plist-get reply :thread))
         (opencortex--turn-started (plist-get reply :turn-id)))
       (lambda (message)
         (opencortex--show-error
          (format "Your message was not sent: %s.%s" message
                  (if from-input " It is back in the input area: C-c RET tries again." "")))
         (when from-input (opencortex--restore-input text))))))))

;;;###autoload
(defun opencortex-send-region (start end &optional question)
  "Send the text between START and END to the chat, after QUESTION.
Interactively the region, and with a prefix argument a question about it,
read in the minibuffer.  The text goes as an org block (a source block
in the buffer's language in a programming mode), escaped as org escapes
code, so nothing in it can end the block; the chat buffer is shown."
  (interactive
   (progn
     (unless (use-region-p)
       (user-error "No region: mark the text to send first"))
     (list (region-beginning) (region-end)
           (and current-prefix-arg (read-string "Ask about the region: ")))))
  (let ((text (buffer-substring-no-properties start end))
        (question (string-trim (or question ""))))
    (when (string-empty-p (string-trim text))
      (user-error "Nothing to send: the region is blank"))
    (let ((block (opencortex--region-block text (opencortex--region-language))))
      (display-buffer (opencortex--chat-buffer))
      (opencortex-send (if (string-empty-p question) block
                         (concat question "\n\n" block))))))

(defun opencortex--region-language ()
  "The language of the current buffer's code, for a source block, or nil."
  (when (derived-mode-p 'prog-mode)
    (replace-regexp-in-string
     "\\(?:-ts\\)?-mode\\'" "" (symbol-name major-mode))))

(defun opencortex--region-block (text language)
  "TEXT as an org source block in LANGUAGE (nil: an example block).
Lines of TEXT that org would read as a heading or a block line are escaped
with a comma, as `org-escape-code-in-string' does."
  (require 'org-src)
  (format "#+begin_%s\n%s\n#+end_%s"
          (if language (concat "src " language) "example")
          (string-trim-right (org-escape-code-in-string text) "\n+")
          (if language "src" "example")))

(defun opencortex-abort ()
  "Abort the turn in progress."
  (interactive)
  (opencortex--request 'abort-turn (list opencortex-chat-id)
                       (lambda (running)
                         (message (if running "opencortex: aborting the turn"
                                    "opencortex: no turn is running")))))

(defun opencortex-reload-skills ()
  "Reload the kernel's skills from disk and report broken ones."
  (interactive)
  (opencortex--request
   'reload-skills nil
   (lambda (reply)
     (let ((errors (plist-get reply :errors)))
       (message "opencortex: %s skills loaded" (plist-get reply :skills))
       (when errors
         (opencortex--show-error (concat "Some skills did not load:\n"
                                         (mapconcat #'identity errors "\n"))))))))

(defun opencortex-open-memory ()
  "Open the org file where the kernel archives this chat's thread."
  (interactive)
  (opencortex--request
   'status (list opencortex-chat-id)
   (lambda (status)
     (opencortex--set-status status)
     (let ((file (plist-get status :memory-file)))
       (if (and (stringp file) (not (string-empty-p file)))
           (find-file file)
         (message "opencortex: the kernel named no memory file"))))))

;;;; Branches

(defun opencortex--request-sync (method args)
  "Call METHOD with ARGS in the kernel, wait for the answer and return it.
Only for commands that need the answer before they can go on, such as
a list to complete from.  The wait is bounded by
`opencortex-wait-timeout'; \\[keyboard-quit] ends it sooner."
  (let (done value failure)
    (opencortex--request method args
                         (lambda (result) (setq value result done t))
                         (lambda (message) (setq failure message done t)))
    (unless (opencortex-wait-for (lambda () done))
      (user-error "The kernel did not answer %s within %s s" method opencortex-wait-timeout))
    (when failure
      (user-error "The kernel could not do %s: %s" method (opencortex--visible failure)))
    value))

(defun opencortex--positive-integer (value what)
  "VALUE when it is a positive integer, else a `user-error' naming WHAT."
  (unless (and (integerp value) (> value 0))
    (user-error "%s must be a positive whole number, not %S" what value))
  value)

(defun opencortex-fork (&optional turn)
  "Start a new branch of this chat from the latest turn, or from TURN.
With a prefix argument, ask for TURN.  The kernel names the branch and
moves the chat onto it; the branch it left keeps its turns.  This runs
the slash command /fork."
  (interactive (list (and current-prefix-arg (read-number "Fork from turn: "))))
  (opencortex--slash-command
   (if turn (format "/fork %d" (opencortex--positive-integer turn "The turn")) "/fork")))

(defun opencortex-rewind (turn)
  "Go back to TURN of the current branch.
The later turns are kept on a branch of their own.  Interactively, ask
for TURN.  This runs the slash command /rewind TURN."
  (interactive (list (read-number "Rewind to turn: "
                                  (let ((turn (plist-get opencortex--status :turn)))
                                    (and (integerp turn) (> turn 1) (1- turn))))))
  (opencortex--slash-command
   (format "/rewind %d" (opencortex--positive-integer turn "The turn"))))

(defun opencortex--branch-names (branches)
  "The names in BRANCHES, the answer of the kernel's `branches', current first."
  (let ((names (delq nil (mapcar (lambda (branch)
                                   (let ((name (plist-get branch :name)))
                                     (and (stringp name) name)))
                                 branches))))
    (append (cl-remove-if-not (lambda (name) (opencortex--branch-current-p branches name)) names)
            (cl-remove-if (lambda (name) (opencortex--branch-current-p branches name)) names))))

(defun opencortex--branch-current-p (branches name)
  "Whether the branch NAME is the current one in BRANCHES."
  (cl-some (lambda (branch) (and (equal (plist-get branch :name) name)
                                 (plist-get branch :current)))
           branches))

(defvar opencortex--branch-history nil
  "Branch names given to `opencortex-switch-branch'.")

(defun opencortex--read-branch (branches)
  "Ask for the name of a branch among BRANCHES (a list of plists).
Each plist has :name, :head_turn, :turns and :current; the completion
list shows the last three."
  (let* ((names (opencortex--branch-names branches))
         (others (cl-remove-if (lambda (name) (opencortex--branch-current-p branches name))
                               names))
         (completion-extra-properties
          (list :annotation-function
                (lambda (name)
                  (let ((branch (cl-find name branches
                                         :key (lambda (b) (plist-get b :name)) :test #'equal)))
                    (format "  %s turns, head at turn %s%s"
                            (plist-get branch :turns) (plist-get branch :head_turn)
                            (if (plist-get branch :current) " (current)" "")))))))
    (unless others
      (user-error "This chat has no other branch (%s); M-x opencortex-fork makes one"
                  (or (car names) "none yet")))
    (completing-read (format-prompt "Switch to branch" (car others))
                     names nil t nil 'opencortex--branch-history (car others))))

(defun opencortex-switch-branch (name)
  "Move this chat to the branch NAME.
Interactively, ask for NAME with completion over the kernel's branches.
This runs the slash command /switch NAME."
  (interactive (list (opencortex--read-branch
                      (opencortex--request-sync 'branches (list opencortex-chat-id)))))
  (when (or (not (stringp name)) (string-empty-p name)
            (string-match-p "[[:space:][:cntrl:]]" name))
    (user-error "No such branch name: %S" name))
  (opencortex--slash-command (concat "/switch " name)))

;;;; Backend and model

(defconst opencortex--backends '("auto" "echo" "script" "anthropic" "openai")
  "The backends `opencortex serve --backend' accepts.")

(defun opencortex--apply-kernel-option (option value)
  "Set OPTION to VALUE in `opencortex-kernel-arguments'; say when it will apply.
A running kernel that Emacs started is restarted, after asking; a kernel
Emacs connected to through its file keeps its own settings."
  (setq opencortex-kernel-arguments
        (opencortex--with-kernel-option opencortex-kernel-arguments option value))
  (let* ((conn opencortex--connection)
         (what (if value (format "%s %s" option value) (format "no %s" option))))
    (cond ((not (opencortex--live-p conn))
           (message "opencortex: the next kernel starts with %s" what))
          ((not (opencortex--connection-process conn))
           (message "opencortex: the kernel you connected to keeps its own settings; %s applies to a kernel Emacs starts"
                    what))
          ((y-or-n-p (format "Restart the kernel now with %s? " what))
           (opencortex-restart))
          (t (message "opencortex: %s applies from the next start (M-x opencortex-restart)"
                      what)))))

(defun opencortex-set-backend (backend)
  "Make the kernel answer with BACKEND, one of `opencortex--backends'.
This sets \"--backend\" in `opencortex-kernel-arguments' for this
session (customize that variable to keep it).  When Emacs started the
running kernel, it asks whether to restart it now; a kernel connected
to through its connection file is left alone."
  (interactive (list (completing-read
                      (format-prompt "Backend" (opencortex--kernel-option "--backend"))
                      opencortex--backends nil t nil nil
                      (opencortex--kernel-option "--backend"))))
  (unless (member backend opencortex--backends)
    (user-error "Unknown backend %S; one of %s" backend
                (mapconcat #'identity opencortex--backends ", ")))
  (opencortex--apply-kernel-option "--backend" backend))

(defun opencortex-set-model (model)
  "Make every turn use MODEL, or with an empty MODEL the configured ones.
This sets \"--model\" in `opencortex-kernel-arguments' for this session
\(customize that variable to keep it).  When Emacs started the running
kernel, it asks whether to restart it now; a kernel connected to
through its connection file is left alone."
  (interactive (list (let ((now (opencortex--kernel-option "--model")))
                       (read-string (format "Model (%sempty: the configured ones): "
                                            (if now (format "now %s; " now) ""))))))
  (let ((model (string-trim model)))
    (when (string-match-p "[[:space:][:cntrl:]]" model)
      (user-error "A model name has no spaces: %S" model))
    (opencortex--apply-kernel-option "--model" (and (not (string-empty-p model)) model))))

(provide 'opencortex)
;;; opencortex.el ends here
