;;; opencortex-approval.el --- Approving or denying what the kernel wants to run  -*- lexical-binding: t; coding: utf-8 -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; When an action needs a person's yes (a shell command, a post to another
;; conversation), the kernel calls `opencortex-ask-approval'.  The chat
;; buffer then shows what would happen, with [Approve] and [Deny] buttons;
;; \\[opencortex-approve] and \\[opencortex-deny] answer the latest pending
;; one.  The answer goes back with `answer-approval'.  No answer within the
;; request's :timeout is a denial: the prompt then says so (the kernel
;; denies on its own at the same time).
;;
;; The block is built from the kernel's facts only: the title, what will
;; run (or be sent) in an escaped example block, the directory, the names
;; of the environment variables, the skill that asked, the conversation.
;; A tool call shows the tool's name, its arguments and what it would
;; change (a diff the tool made), each of the last two in an escaped
;; example block of its own.
;; The model's own words about its request come last, as one quoted line
;; of at most `opencortex-approval-note-limit' characters in
;; `opencortex-model-note-face', marked unverified, with no org links: a
;; model cannot draw a second approval block, a heading or a button.

;;; Code:

(require 'cl-lib)
(require 'button)
(require 'org-src)
(require 'subr-x)
(require 'opencortex-chat)

(defcustom opencortex-approval-default-timeout 120
  "Seconds an approval waits when the kernel names no :timeout."
  :type 'number
  :group 'opencortex)

(defcustom opencortex-approval-note-limit 200
  "Most characters of the model's note shown in an approval request.
The kernel caps the note too; a longer one is cut and ends with \"…\"."
  :type 'natnum
  :group 'opencortex)

(cl-defstruct (opencortex--approval (:constructor opencortex--make-approval (id))
                                    (:copier nil))
  "One approval request shown in the chat buffer.
START and END hold the line of buttons, replaced by the outcome."
  id start end timer)

(defvar opencortex--approvals nil
  "Approvals waiting for an answer, newest first.")

(defun opencortex-pending-approvals ()
  "Ids of the approvals waiting for an answer, newest first."
  (mapcar #'opencortex--approval-id opencortex--approvals))

(defun opencortex--org-example (text)
  "TEXT as the inside of an org example block.
Control characters are made visible, and lines that org would read as
structure (starting with * or #+, possibly indented, or with such a line
escaped by commas) get org's comma escape: nothing inside can end the
block or start a heading."
  (org-escape-code-in-string (opencortex--ensure-newline (opencortex--visible text))))

(defun opencortex--approval-string (details key)
  "The string under KEY in DETAILS, or nil when it is missing, empty or no string."
  (let ((value (plist-get details key)))
    (and (stringp value) (not (string-empty-p value)) value)))

(defun opencortex--approval-strings (details key)
  "The strings in the list under KEY in DETAILS (others are left out)."
  (let ((value (plist-get details key)))
    (and (listp value) (cl-remove-if-not #'stringp value))))

(defun opencortex--approval-title (details)
  "The title of the request DETAILS, from :title or else from its kind."
  (or (opencortex--approval-string details :title)
      (cond ((equal (plist-get details :action-class) "cross-post")
             "Post to another conversation")
            ((or (opencortex--approval-string details :command)
                 (opencortex--approval-strings details :argv))
             "Run a command")
            ((opencortex--approval-string details :tool)
             (concat "Use the tool " (opencortex--approval-string details :tool)))
            (t "An action"))))

(defun opencortex--approval-note (details)
  "The model's note in DETAILS (:model-note, or the older :reason), or nil."
  (or (opencortex--approval-string details :model-note)
      (opencortex--approval-string details :reason)))

(defun opencortex--approval-field (label value)
  "The description-list line LABEL :: VALUE, VALUE made one inert line.
Nothing when VALUE is nil."
  (if value (format "- %s :: %s\n" label (opencortex--inert-line value)) ""))

(defun opencortex--approval-block (label text)
  "The line LABEL ::, then TEXT in an escaped example block; nothing for nil TEXT.
See `opencortex--org-example' for the escaping."
  (if text
      (concat (format "- %s ::\n#+begin_example\n" label)
              (opencortex--org-example text)
              "#+end_example\n")
    ""))

(defun opencortex--quote-argument (argument)
  "ARGUMENT as a Lisp string literal, newlines and controls escaped."
  (let ((print-escape-newlines t)
        (print-escape-control-characters t))
    (prin1-to-string argument)))

(defun opencortex--approval-text (details)
  "Org text describing the approval request DETAILS (a plist).
It is built from the kernel's facts: the :title; the :command (or the
:argv joined), the :text to post or the printed :action in an escaped
example block; for a tool call the :tool's name, then its :arguments
and its :preview (what it would change) each in an escaped example
block; then :target, :argv, :cwd, :env (names), :skill and :thread,
each one inert line.  Last comes the model's note (see
`opencortex--approval-note') as one quoted, capped, inert line in
`opencortex-model-note-face'."
  (let* ((argv (opencortex--approval-strings details :argv))
         (shown (or (opencortex--approval-string details :command)
                    (and argv (mapconcat #'identity argv " "))
                    (opencortex--approval-string details :text)
                    (opencortex--approval-string details :action)))
         (class (opencortex--approval-string details :action-class))
         (env (opencortex--approval-strings details :env))
         (note (opencortex--approval-note details)))
    (concat
     (format "* Approval needed: %s\n"
             (opencortex--inert-line (opencortex--approval-title details) 120))
     (if shown (concat "#+begin_example\n" (opencortex--org-example shown) "#+end_example\n") "")
     (opencortex--approval-field "tool" (opencortex--approval-string details :tool))
     (opencortex--approval-block "arguments" (opencortex--approval-string details :arguments))
     (opencortex--approval-block "changes" (opencortex--approval-string details :preview))
     (if (and class (not (member class '("shell" "cross-post" "tool"))))
         (opencortex--approval-field "action" class)
       "")
     (opencortex--approval-field "post to" (opencortex--approval-string details :target))
     (if argv
         (opencortex--approval-field "argv" (mapconcat #'opencortex--quote-argument argv " "))
       "")
     (opencortex--approval-field "directory" (opencortex--approval-string details :cwd))
     (if (or env (plist-member details :env) (equal class "shell"))
         (opencortex--approval-field "environment"
                                     (if env (mapconcat #'identity env ", ") "(none passed)"))
       "")
     (opencortex--approval-field "asked by skill" (opencortex--approval-string details :skill))
     (opencortex--approval-field "conversation" (opencortex--approval-string details :thread))
     (if note
         (concat "- the model says (unverified) :: "
                 (propertize
                  (concat "“" (opencortex--inert-line note opencortex-approval-note-limit) "”")
                  'face 'opencortex-model-note-face
                  'font-lock-face 'opencortex-model-note-face
                  'opencortex-model-text t
                  'help-echo "The model's words: the kernel did not check them")
                 "\n")
       ""))))

(defun opencortex--handle-ask-approval (approval-id details)
  "Method `opencortex-ask-approval': show APPROVAL-ID, described by DETAILS.
DETAILS is a plist: :title, :action-class (\"shell\", \"cross-post\",
\"tool\" or a target), :command and :argv (what will run), :cwd, :env
\(names of the environment variables passed), :skill (which skill
asked), :thread (the conversation asking), :target and :text (where a
post goes and what it says), :tool, :arguments and :preview (a tool
call: the tool's name, its printed arguments, what it would change),
:action (any other action, printed), :model-note (the model's words;
the older :reason counts as the same) and :timeout (seconds).
See `opencortex--approval-text'."
  (let* ((id (if (stringp approval-id) approval-id (format "%s" approval-id)))
         (timeout (let ((given (plist-get details :timeout)))
                    (if (and (numberp given) (> given 0))
                        given
                      opencortex-approval-default-timeout)))
         (approval (opencortex--make-approval id)))
    (unless (and (listp details) (listp (plist-get details :argv)))
      (error "The approval details must be a plist, with :argv a list of strings"))
    (opencortex--output (opencortex--approval-text details) nil 'approval)
    (opencortex--with-output
     (lambda ()
       (let ((beg (point)))
         (insert-text-button "[Approve]" 'action (lambda (_) (opencortex-approve id))
                             'follow-link t 'help-echo "Run it")
         (insert " ")
         (insert-text-button "[Deny]" 'action (lambda (_) (opencortex-deny id))
                             'follow-link t 'help-echo "Do not run it")
         (insert (format "  C-c C-a approves, C-c C-d denies; no answer in %s s means no"
                         timeout))
         (setf (opencortex--approval-start approval) (copy-marker beg)
               (opencortex--approval-end approval) (point-marker))
         (insert "\n")
         (add-text-properties beg (point) '(read-only t front-sticky (read-only)))
         (opencortex--changed beg (point)))))
    (setf (opencortex--approval-timer approval)
          (run-at-time timeout nil #'opencortex--approval-timed-out id))
    (push approval opencortex--approvals))
  t)

(defun opencortex--show-outcome (approval outcome face)
  "Replace the buttons (or the previous outcome) of APPROVAL with OUTCOME in FACE."
  (let ((start (opencortex--approval-start approval))
        (end (opencortex--approval-end approval)))
    (when (and (markerp start) (buffer-live-p (marker-buffer start)))
      (with-current-buffer (marker-buffer start)
        (let ((inhibit-read-only t)
              (buffer-undo-list t))
          (save-excursion
            (goto-char start)
            (insert (opencortex--read-only outcome face))
            (delete-region (point) end)
            (set-marker end (point))
            (opencortex--changed start (point))))))))

(defun opencortex--settle-approval (approval outcome face)
  "APPROVAL no longer waits: cancel its timer and show OUTCOME in FACE."
  (when (timerp (opencortex--approval-timer approval))
    (cancel-timer (opencortex--approval-timer approval)))
  (setq opencortex--approvals (delq approval opencortex--approvals))
  (opencortex--show-outcome approval outcome face))

(defun opencortex--forget-approval (approval)
  "Release the markers of APPROVAL."
  (dolist (marker (list (opencortex--approval-start approval)
                        (opencortex--approval-end approval)))
    (when (markerp marker) (set-marker marker nil))))

(defun opencortex--approval-timed-out (id)
  "No answer came for approval ID in time: it is denied."
  (let ((approval (cl-find id opencortex--approvals
                           :key #'opencortex--approval-id :test #'equal)))
    (when approval
      (opencortex--settle-approval approval "=> timed out — denied" 'opencortex-error-face)
      (opencortex--forget-approval approval))))

(defun opencortex--answer (id answer)
  "Answer approval ID (the latest pending when nil) with ANSWER, \"yes\" or \"no\"."
  (let ((approval (if id
                      (cl-find id opencortex--approvals
                               :key #'opencortex--approval-id :test #'equal)
                    (car opencortex--approvals)))
        (yes (equal answer "yes")))
    (cond
     (approval
      (opencortex--settle-approval approval (if yes "=> approving…" "=> denying…") 'shadow)
      (opencortex--request
       'answer-approval (list (opencortex--approval-id approval) answer)
       (lambda (known)
         (if known
             (opencortex--show-outcome approval (if yes "=> approved" "=> denied")
                                       (if yes 'success 'opencortex-error-face))
           (opencortex--show-outcome approval "=> expired before the answer — denied"
                                     'opencortex-error-face))
         (opencortex--forget-approval approval))
       (lambda (message)
         (opencortex--show-outcome
          approval (format "=> the answer did not reach the kernel (%s) — denied" message)
          'opencortex-error-face)
         (opencortex--forget-approval approval))))
     (id (message "opencortex: approval %s no longer waits for an answer" id))
     (t (user-error "No approval is waiting for an answer")))))

(defun opencortex-approve (&optional id)
  "Approve request ID, by default the latest one waiting."
  (interactive)
  (opencortex--answer id "yes"))

(defun opencortex-deny (&optional id)
  "Deny request ID, by default the latest one waiting."
  (interactive)
  (opencortex--answer id "no"))

(defun opencortex--abandon-approvals ()
  "The kernel is gone: no approval waits any more."
  (dolist (approval opencortex--approvals)
    (opencortex--settle-approval approval "=> the kernel stopped — denied"
                                 'opencortex-error-face)
    (opencortex--forget-approval approval)))

(provide 'opencortex-approval)
;;; opencortex-approval.el ends here
